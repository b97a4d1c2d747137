// The console's orders, apart from the page so that they can be tested without a browser
// (tests/unit/test_console_order.py runs this file under node).
"use strict";

// "default.2" before "default.10": digit runs compare as numbers (a partition's index),
// the rest as text -- the order of `nonstop partition list` (commands/partition_commands.py).
function naturalKey(name) {
  return String(name).split(/(\d+)/).map((part, i) => (i % 2 ? Number(part) : part));
}

function naturalCompare(a, b) {
  const ka = naturalKey(a), kb = naturalKey(b);
  for (let i = 0; i < Math.min(ka.length, kb.length); i++) {
    if (ka[i] < kb[i]) return -1;
    if (ka[i] > kb[i]) return 1;
  }
  return ka.length - kb.length;
}

function byPartitionName(partitions) {
  return [...partitions].sort((p, q) => naturalCompare(p.name, q.name));
}

if (typeof module !== "undefined") module.exports = { naturalCompare, byPartitionName };
