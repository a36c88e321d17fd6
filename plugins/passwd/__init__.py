"""plugins/passwd: users and passwords from a file, VerneMQ's vmq_passwd.

    [plugins.passwd]
    enabled = true
    password_file = "/etc/nautilus/passwd"
    password_reload_interval = 10    # seconds; 0 = never re-read
    max_queued_checks = 2000         # scrypt checks waiting at once; beyond: "server busy"

Reads VerneMQ's `$6$` lines and writes salted scrypt ones (`nautilus passwd FILE USER`).
See docs/plugins/passwd.md.
"""

from plugins.passwd.plugin import PasswdConfig, PasswdPlugin

PLUGIN = PasswdPlugin

__all__ = ["PLUGIN", "PasswdConfig", "PasswdPlugin"]
