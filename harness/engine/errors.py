"""How the engine refuses: one exception whose message is the one line a user reads."""


class UsageError(Exception):
    """Bad input or usage; the message is the one line printed (the command
    line exits 2 with it, the pytest plugin fails the session with it)."""
