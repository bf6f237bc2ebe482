"""The error of a bad `obleth simulate` flag."""

from __future__ import annotations

from gateway.errors import OblethError


class BadFlag(OblethError, ValueError):
    """A flag of ``obleth simulate`` has a value it cannot use; the message names the flag,
    the value and what it accepts. The command exits with status 2 and no traceback."""

    def __init__(self, flag: str, value: object, expected: str, *, told: bool = False) -> None:
        """``expected`` says what the flag accepts; with ``told``, it is a whole account of
        what is wrong (as a setting's error gives it) and is shown as it is."""
        self.flag = flag
        self.value = value
        super().__init__(f"{flag} {value!r}: {expected if told else 'expected ' + expected}")
