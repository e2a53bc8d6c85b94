"""Single key presses for `minilin watch`, without Enter where the terminal allows it.

    with Keys() as keys:
        key = keys.wait(0.5)     # a lower-case letter, or None after 0.5 s without one

On a POSIX terminal, stdin is put in cbreak mode (termios) while `watch` runs: every key arrives at once, not
echoed, and Ctrl-C still stops the program; the terminal's mode is restored on the way out, also after an
error. On Windows, msvcrt reads the console's keys. Anywhere else (stdin a pipe, a file, or pytest's
captured input), whole lines are read: type the letter and Enter. Where stdin cannot be read at all, or has
ended, `wait` only waits.
"""
from __future__ import annotations

import os
import sys
import time


class Keys:
    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stdin
        self.mode = "none"        # "cbreak", "windows", "lines" or "none"
        self._saved = None
        self._fd = None
        self._pending = b""      # lines mode: what was read past the last line handed out

    @property
    def single(self) -> bool:
        """True when a key needs no Enter."""
        return self.mode in ("cbreak", "windows")

    def __enter__(self):
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return self
        self._fd = fd
        interactive = False
        try:
            interactive = self.stream.isatty()
        except (AttributeError, OSError, ValueError):
            pass
        if interactive and os.name == "nt":
            self.mode = "windows"
            return self
        if interactive:
            try:
                import termios
                import tty

                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.mode = "cbreak"
                return self
            except (ImportError, OSError, Exception):  # termios.error is not an OSError
                self._saved = None
        self.mode = "lines" if os.name != "nt" else "none"  # select() takes pipes on POSIX only
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None
        return False

    def _line(self) -> str:
        line, self._pending = self._pending.split(b"\n", 1)
        return (line.decode(errors="replace").strip()[:1] or "\n").lower()

    def wait(self, seconds: float):
        """The next key (lower-cased; Enter alone gives "\\n"), or None after `seconds` without one."""
        if self.mode == "windows":
            import msvcrt

            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if msvcrt.kbhit():
                    return msvcrt.getwch().lower()
                time.sleep(0.05)
            return None
        if self.mode == "lines" and b"\n" in self._pending:
            return self._line()
        if self.mode in ("cbreak", "lines"):
            import select

            end = time.monotonic() + seconds
            while True:
                try:
                    ready, _, _ = select.select([self._fd], [], [], max(end - time.monotonic(), 0.0))
                except (OSError, ValueError):
                    self.mode = "none"
                    return None
                if not ready:
                    return None
                data = os.read(self._fd, 1 if self.mode == "cbreak" else 1024)
                if not data:  # the input ended: from now on, only wait
                    self.mode = "none"
                    return None
                if self.mode == "cbreak":
                    return data.decode(errors="replace").lower()
                self._pending += data
                if b"\n" in self._pending:
                    return self._line()
        time.sleep(seconds)
        return None
