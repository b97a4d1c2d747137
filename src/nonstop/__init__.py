"""nonstop: a highly available, transactional object store for Python."""
