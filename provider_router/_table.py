"""Tables that fit the width they are printed at, without cutting a name or a number.

A rich ``Table`` squeezes its columns to the page and cuts cells (``DeepIn…``,
``150/1…``). :class:`FitTable` never cuts one: it tries, until one fits, every column
on one line; headers over two lines; free text (``Column(below=True)``) under its
row; columns dropped in their ``drop`` order (and named); each row as a block of
``header: value`` lines. On a terminal it draws boxes; elsewhere it is plain, one row
per line, so ``grep`` finds a row by its name (docs/observability.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

__all__ = ["Column", "FitTable", "wrap_words"]

Justify = Literal["left", "right"]

_NOTE_INDENT: Final = 3
"""How far a row's below-text is indented under the row."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a :class:`FitTable`.

    Attributes:
        header: its heading (may break over two lines at a space when room is short).
        justify: ``"right"`` for numbers, ``"left"`` for names.
        drop: ``None``: never dropped; otherwise columns are dropped lowest ``drop``
            first when the table does not fit (and named under it).
        below: free text (a reason, a note): when the row is too wide it goes on
            its own line(s) under the row, word-wrapped, instead of in a column.
        key: what names the row in the stacked layout (its first line).
        labelled: under its row, the text reads ``header: text`` (a value that does
            not say what it is on its own).
    """

    header: str
    justify: Justify = "left"
    drop: int | None = None
    below: bool = False
    key: bool = False
    labelled: bool = False


@dataclass(frozen=True, slots=True)
class _Layout:
    shown: tuple[int, ...]  # indexes of the columns in the row
    below: tuple[int, ...]  # indexes of the columns printed under the row
    dropped: tuple[int, ...]
    headers: tuple[tuple[str, ...], ...]  # per shown column: its header lines
    widths: tuple[int, ...]  # per shown column


class FitTable:
    """A table laid out for the width it is printed at (see the module docstring).

    Args:
        columns: the columns, left to right.
        title: a line above the table (word-wrapped).
        caption: a line under the table (word-wrapped).
        boxed: draw boxes (True) or print plain columns (False); default: boxes on
            a terminal, plain elsewhere.
    """

    def __init__(
        self,
        *columns: Column,
        title: str | None = None,
        caption: str | None = None,
        boxed: bool | None = None,
    ) -> None:
        self.columns = columns
        self.title = title
        self.caption = caption
        self.boxed = boxed
        self.rows: list[tuple[Text, ...]] = []
        self._sections: set[int] = set()  # a rule after these row indexes

    def add_row(self, *cells: str | Text | None, end_section: bool = False) -> None:
        """Add a row (``str`` is plain text, never markup; ``None`` is an empty cell)."""
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        row = tuple(Text("") if c is None else Text(c) if isinstance(c, str) else c for c in cells)
        self.rows.append(row)
        if end_section:
            self._sections.add(len(self.rows) - 1)

    # --- layout ------------------------------------------------------------------

    def _natural(self, index: int) -> int:
        return max((r[index].cell_len for r in self.rows), default=0)

    def _total(self, widths: Sequence[int], boxed: bool) -> int:
        if not widths:
            return 0
        if boxed:
            return sum(widths) + 3 * len(widths) + 1
        return sum(widths) + 2 * (len(widths) - 1)

    def _try(self, shown: Sequence[int], below: Sequence[int], dropped: Sequence[int],
             width: int, boxed: bool) -> _Layout | None:  # fmt: skip
        for split in (False, True):
            headers = tuple(_header_lines(self.columns[i].header, split) for i in shown)
            widths = tuple(
                max(self._natural(i), *(cell_len(h) for h in lines))
                for i, lines in zip(shown, headers, strict=True)
            )
            if self._total(widths, boxed) <= width:
                return _Layout(tuple(shown), tuple(below), tuple(dropped), headers, widths)
        return None

    def layout(self, width: int, *, boxed: bool) -> _Layout | None:
        """The layout that fits ``width`` (None: only the stacked one does)."""
        every = list(range(len(self.columns)))
        below = [i for i in every if self.columns[i].below]
        # Text of several lines is never a cell: it goes under its row.
        if not any("\n" in row[i].plain for row in self.rows for i in below):
            fitted = self._try(every, (), (), width, boxed)
            if fitted is not None:
                return fitted
        shown = [i for i in every if i not in below]
        dropped: list[int] = []
        order = sorted(
            (i for i in shown if self.columns[i].drop is not None),
            key=lambda i: (self.columns[i].drop, -i),
        )
        while True:
            fitted = self._try(shown, below, dropped, width, boxed)
            if fitted is not None:
                return fitted
            if not order:
                return None
            gone = order.pop(0)
            shown.remove(gone)
            dropped.append(gone)

    # --- rendering ---------------------------------------------------------------

    def lines(self, width: int, *, boxed: bool) -> list[Text]:
        """The table as lines of at most ``width`` cells (a single longer word aside)."""
        out: list[Text] = []
        if self.title:
            out += [Text(line, style="italic" if boxed else "") for line in
                    wrap_words(self.title, width)]  # fmt: skip
        layout = self.layout(width, boxed=boxed)
        if layout is None:
            out += self._stacked(width, boxed)
        elif boxed:
            out += self._boxed(layout, width)
        else:
            out += self._plain(layout, width)
        if layout is not None and layout.dropped:
            names = ", ".join(self.columns[i].header for i in sorted(layout.dropped))
            out += [Text(line, style="dim" if boxed else "") for line in
                    wrap_words(f"not shown at {width} columns: {names}", width)]  # fmt: skip
        if self.caption:
            out += [Text(line, style="dim" if boxed else "") for line in
                    wrap_words(self.caption, width)]  # fmt: skip
        return out

    def render(self, width: int, *, boxed: bool) -> str:
        """:meth:`lines` as plain text (no styles), for files and tests."""
        return "\n".join(line.plain.rstrip() for line in self.lines(width, boxed=boxed)) + "\n"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        boxed = console.is_terminal if self.boxed is None else self.boxed
        for line in self.lines(options.max_width, boxed=boxed):
            line.no_wrap = False
            yield line

    def _cells(self, row: tuple[Text, ...], layout: _Layout, *, boxed: bool) -> Text:
        parts: list[Text] = []
        for i, w in zip(layout.shown, layout.widths, strict=True):
            cell = row[i]
            pad = " " * (w - cell.cell_len)
            right = self.columns[i].justify == "right"
            parts.append(Text(pad) + cell if right else cell + Text(pad))
        if boxed:
            return Text("│ ") + Text(" │ ").join(parts) + Text(" │")
        return Text("  ").join(parts)

    def _header_rows(self, layout: _Layout, *, boxed: bool) -> list[Text]:
        depth = max(len(h) for h in layout.headers)
        rows = []
        for line in range(depth):
            parts = []
            for i, lines, w in zip(layout.shown, layout.headers, layout.widths, strict=True):
                # Two-line headers sit on the bottom line, like rich's.
                at = line - (depth - len(lines))
                text = lines[at] if at >= 0 else ""
                right = self.columns[i].justify == "right"
                parts.append(Text(text.rjust(w) if right else text.ljust(w), style="bold"))
            if boxed:
                rows.append(Text("┃ ") + Text(" ┃ ").join(parts) + Text(" ┃"))
            else:
                rows.append(Text("  ").join(parts))
        return rows

    def _notes(self, row: tuple[Text, ...], layout: _Layout, inner: int) -> Iterator[str]:
        for i in layout.below:
            text = row[i].plain.strip()
            if text and self.columns[i].labelled:
                text = f"{self.columns[i].header}: {text}"
            if text:
                yield from wrap_words(text, max(inner - _NOTE_INDENT, 20))

    def _boxed(self, layout: _Layout, width: int) -> list[Text]:
        def rule(left: str, mid: str, right: str, fill: str) -> Text:
            return Text(left + mid.join(fill * (w + 2) for w in layout.widths) + right)

        total = self._total(layout.widths, True)
        inner = total - 4
        out = [rule("┏", "┳", "┓", "━"), *self._header_rows(layout, boxed=True)]
        out.append(rule("┡", "╇", "┩", "━"))
        for index, row in enumerate(self.rows):
            out.append(self._cells(row, layout, boxed=True))
            for note in self._notes(row, layout, inner):
                body = " " * _NOTE_INDENT + note
                pad = " " * max(inner - cell_len(body), 0)
                out.append(Text("│ ") + Text(body + pad, style="dim") + Text(" │"))
            if index in self._sections and index != len(self.rows) - 1:
                out.append(rule("├", "┼", "┤", "─"))
        out.append(rule("└", "┴", "┘", "─"))
        return out

    def _plain(self, layout: _Layout, width: int) -> list[Text]:
        out = self._header_rows(layout, boxed=False)
        out.append(Text("  ".join("-" * w for w in layout.widths)))
        for index, row in enumerate(self.rows):
            out.append(self._cells(row, layout, boxed=False))
            out += [Text(" " * _NOTE_INDENT + n) for n in self._notes(row, layout, width)]
            if index in self._sections and index != len(self.rows) - 1:
                out.append(Text("  ".join("-" * w for w in layout.widths)))
        return [Text(line.plain.rstrip()) for line in out]  # plain: no styles either

    def _stacked(self, width: int, boxed: bool) -> list[Text]:
        keys = [i for i, c in enumerate(self.columns) if c.key] or [0]
        out: list[Text] = []
        for row in self.rows:
            head = Text(" ").join(row[i] for i in keys if row[i].plain)
            out.append(head.copy() if boxed else Text(head.plain))
            if boxed:
                out[-1].stylize("bold")
            pairs = []
            notes = []
            for i, column in enumerate(self.columns):
                if i in keys or not row[i].plain:
                    continue
                if column.below:
                    notes.append(row[i].plain)
                else:
                    value = row[i] if boxed else Text(row[i].plain)
                    pairs.append(Text(f"{column.header}: ", style="dim" if boxed else "") + value)
            out += _flow(pairs, width, indent=_NOTE_INDENT)
            for note in notes:
                out += [Text(" " * _NOTE_INDENT + line)
                        for line in wrap_words(note, width - _NOTE_INDENT)]  # fmt: skip
        return out


def _header_lines(header: str, split: bool) -> tuple[str, ...]:
    """``header`` on one line, or on two broken at the space that makes it narrowest."""
    if not split or " " not in header:
        return (header,)
    best: tuple[str, ...] = (header,)
    for at in (i for i, ch in enumerate(header) if ch == " "):
        pair = (header[:at], header[at + 1 :])
        if max(map(cell_len, pair)) < max(map(cell_len, best)):
            best = pair
    return best


def _flow(items: Sequence[Text], width: int, *, indent: int) -> list[Text]:
    """``items`` three spaces apart, as many to a line as fit ``width``, indented."""
    lines: list[Text] = []
    line = Text(" " * indent)
    for item in items:
        if line.cell_len > indent and line.cell_len + 3 + item.cell_len > width:
            lines.append(line)
            line = Text(" " * indent)
        if line.cell_len > indent:
            line.append("   ")
        line.append_text(item)
    if line.cell_len > indent:
        lines.append(line)
    return lines


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` cells (a longer word
    keeps its own line whole: a URL or a number is never cut); the spaces inside a
    line are kept as they are (aligned labels stay aligned)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for token in _WORDS.findall(paragraph.strip()):
            if line and cell_len(line + token.rstrip()) > width:
                lines.append(line.rstrip())
                line = ""
            line += token
        lines.append(line.rstrip())
    return lines


_WORDS: Final = re.compile(r"\S+\s*")
"""A word and the spaces after it."""
