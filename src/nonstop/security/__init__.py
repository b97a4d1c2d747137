"""Users, roles and who may do what (G5): docs/security.md."""
