"""A progress bar for autotuning: tqdm when installed, else one line on stderr."""

from __future__ import annotations

import sys


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class TextBar(_Silent):
    """`[#####.....] 12/40 text`, redrawn in place on one line."""

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.text, self.width = max(total, 1), 0, "", width
        self.stream = stream if stream is not None else sys.stderr
        self._last = 0
        self._draw()

    def _draw(self) -> None:
        filled = self.width * self.done // self.total
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {self.text}"
        line = line[:160]
        # pad with spaces: a shorter line must not leave a longer one's tail behind
        self.stream.write("\r" + line.ljust(self._last))
        self._last = len(line)
        self.stream.flush()

    def update(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        self._draw()

    def set_description(self, text: str) -> None:
        self.text = text
        self._draw()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def progress_bar(total: int, enabled: bool = True, desc: str = "autotune"):
    """An object with update(n), set_description(text) and close()."""
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return TextBar(total)
    return tqdm(total=total, desc=desc, unit="plan", dynamic_ncols=True)
