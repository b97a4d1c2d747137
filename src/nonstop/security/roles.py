"""Roles and the operation matrix: which permission each client op needs, which role grants it.

Every client request is checked before anything else sees it (``runtime/clients.py``,
``node/router.py``).  Permissions:

* ``status``: look at the cluster (``ping``, ``status``, ``runtime_stats``, ``nodes``,
  ``types``, ``config.list``, ``config.show``, ``config.effective``, ``samples``;
  configuration changes, op ``config``, are ``admin``);
* ``data``: read and write objects (``tx.*``, ``request.result``, ``bulk.*``);
* ``membership``: add or remove cluster members (``join``, ``leave``);
* ``users``: manage users (``user.add``, ``user.remove``, ``user.passwd``,
  ``user.roles``, ``user.list``);
* ``admin``: any op not listed here (deny by default);
* ``node``: ops only nodes send (``propose``, ``run``, and on a cluster node the
  single-store bulk swap ``bulk.overwrite.commit``): no role grants it, whatever
  the user; only a connection that proved the cluster secret has it;
* ``application``: the ops of application commands (``app.run``, ``app.commands``):
  any user with a role may send them, because each application command checks
  its own permission when it runs (``nonstop.node.app_commands``);
* ``role:NAME`` (:func:`role_permission`): what an application command requires
  when it names an application role: granted by the role ``NAME``, and by ``admin``.

Built-in roles: ``monitor`` (status), ``app`` (status, data), ``operator`` (status,
data, membership), ``admin`` (everything but ``node``).  Any other role name is an
application role: it grants nothing built in, only the application commands that
name it (``role:NAME``; docs/design/admin.md "Application commands").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from nonstop.dataplane.routing import is_data_op

MONITOR = "monitor"
APP = "app"
OPERATOR = "operator"
ADMIN = "admin"
BUILTIN_ROLES = (MONITOR, APP, OPERATOR, ADMIN)

STATUS = "status"
DATA = "data"
MEMBERSHIP = "membership"
USERS = "users"
ADMIN_OPS = "admin"
NODE = "node"
APPLICATION = "application"
ROLE_PREFIX = "role:"

GRANTS: dict[str, frozenset[str]] = {
    MONITOR: frozenset({STATUS}),
    APP: frozenset({STATUS, DATA}),
    OPERATOR: frozenset({STATUS, DATA, MEMBERSHIP}),
    ADMIN: frozenset({STATUS, DATA, MEMBERSHIP, USERS, ADMIN_OPS}),
}

STATUS_OPS = frozenset(
    {
        "ping",
        "status",
        "runtime_stats",
        "nodes",
        "types",
        "config.list",
        "config.show",
        "config.effective",
        "samples",
    }
)
MEMBERSHIP_OPS = frozenset({"join", "leave"})
APPLICATION_OPS = frozenset({"app.run", "app.commands"})
NODE_OPS = frozenset({"propose", "run", "bulk.overwrite.commit"})
"""Never reachable by a user: a proposal goes into every node's log as it is; ``run``
writes branches outside the data service; the single-store swap deletes a type's
objects on one node outside two-phase commit (a cluster swaps with ``tx.overwrite``)."""

_ROLE_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,31}$")
_USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def permission_of(op: object) -> str:
    """The permission a client op needs (module doc)."""
    if not isinstance(op, str):
        return ADMIN_OPS
    if op in NODE_OPS:
        return NODE
    if op in STATUS_OPS:
        return STATUS
    if op in MEMBERSHIP_OPS:
        return MEMBERSHIP
    if op in APPLICATION_OPS:
        return APPLICATION
    if op.startswith("user."):
        return USERS
    if is_data_op(op):
        return DATA
    return ADMIN_OPS


def role_permission(role: str) -> str:
    """The permission an application command needs when it names an application role."""
    return ROLE_PREFIX + check_roles([role])[0]


def allows(roles: Iterable[str], permission: str) -> bool:
    """Whether any of ``roles`` grants ``permission`` (module doc)."""
    roles = list(roles)
    if permission == APPLICATION:
        return bool(roles)
    if permission.startswith(ROLE_PREFIX):
        return permission[len(ROLE_PREFIX) :] in roles or ADMIN in roles
    return any(permission in GRANTS.get(role, ()) for role in roles)


def roles_granting(permission: str) -> list[str]:
    if permission.startswith(ROLE_PREFIX):
        return [permission[len(ROLE_PREFIX) :], ADMIN]
    if permission == APPLICATION:
        return ["any"]
    return [role for role in BUILTIN_ROLES if permission in GRANTS[role]]


def check_roles(roles: object) -> list[str]:
    """A valid, sorted, duplicate-free role list; ``ValueError`` naming a bad one."""
    if not isinstance(roles, list | tuple) or not roles:
        raise ValueError("a user needs at least one role (monitor, app, operator, admin, ...)")
    out = set()
    for role in roles:
        if not isinstance(role, str) or not _ROLE_NAME.match(role):
            raise ValueError(f"bad role name {role!r} (lower case letters, digits, _ . -)")
        out.add(role)
    return sorted(out)


def check_user_name(name: object) -> str:
    if not isinstance(name, str) or not _USER_NAME.match(name):
        raise ValueError(f"bad user name {name!r} (letters, digits, _ . @ -; 1-64)")
    return name


__all__ = [
    "ADMIN",
    "APP",
    "APPLICATION",
    "APPLICATION_OPS",
    "BUILTIN_ROLES",
    "GRANTS",
    "MONITOR",
    "NODE_OPS",
    "OPERATOR",
    "allows",
    "check_roles",
    "check_user_name",
    "permission_of",
    "role_permission",
    "roles_granting",
]
