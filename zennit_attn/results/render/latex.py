r"""Token heatmaps as LaTeX: a snippet of ``\colorbox``\ es, one per token, to ``\input`` in a paper.

Writing it needs no TeX. The snippet needs ``\usepackage{xcolor}`` (or ``color``) in the preamble and compiles with
pdfLaTeX, XeLaTeX and LuaLaTeX: TeX's special characters are escaped, accented Latin letters become accent
commands (``é`` -> ``\'{e}``), and other non-ASCII characters are printed as themselves by the Unicode engines and
as ``U+XXXX`` by pdfLaTeX (the macro ``\zaglyph`` decides). Boxes may break across lines between tokens, spaces are
gaps between boxes, line-break tokens end their paragraph line. Colours are those of
:py:func:`~zennit_attn.results.render.colors.relevance_to_rgb`.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from .colors import relevance_to_rgb, text_color
from .layout import Heatmap, split_space

__all__ = ['latex_escape', 'latex_snippet', 'latex_document', 'save_latex']

_SPECIAL = {
    '\\': r'\textbackslash{}',
    '{': r'\{',
    '}': r'\}',
    '$': r'\$',
    '&': r'\&',
    '#': r'\#',
    '_': r'\_',
    '%': r'\%',
    '~': r'\textasciitilde{}',
    '^': r'\textasciicircum{}',
    '<': r'\textless{}',
    '>': r'\textgreater{}',
    '|': r'\textbar{}',
    '"': "''",
    '-': r'-\kern0pt{}',  # breaks the -- and --- ligatures in pdfTeX and LuaTeX alike (-{} does not in LuaTeX)
    '\u23ce': r'\ensuremath{\hookleftarrow}',
    '\u2423': r'\textvisiblespace{}',
    '\u2205': r'\ensuremath{\emptyset}',
    '\u21e5': r'\ensuremath{\rightarrow\!|}',
    '\u2026': r'\ldots{}',
    '\u2013': '--',
    '\u2014': '---',
    '\u2018': '`',
    '\u2019': "'",
    '\u201c': '``',
    '\u201d': "''",
    '\u00a0': '~',
}
_ACCENTS = {
    '\u0301': "'",
    '\u0300': '`',
    '\u0302': '^',
    '\u0308': '"',
    '\u0303': '~',
    '\u0327': 'c',
    '\u030a': 'r',
    '\u030c': 'v',
    '\u0306': 'u',
    '\u0304': '=',
}
_LETTERS = {
    '\u00df': r'\ss{}',
    '\u00e6': r'\ae{}',
    '\u00c6': r'\AE{}',
    '\u00f8': r'\o{}',
    '\u00d8': r'\O{}',
    '\u0153': r'\oe{}',
    '\u0152': r'\OE{}',
    '\u00e5': r'\aa{}',
    '\u00c5': r'\AA{}',
    '\u0142': r'\l{}',
    '\u0141': r'\L{}',
    '\u00bf': r'?`',
    '\u00a1': r'!`',
}

_PREAMBLE = r"""% zennit-attn token relevance heatmap. Needs \usepackage{xcolor} (or color) in the preamble.
\providecommand{\zaglyph}[2]{\ifdefined\Umathcode#2\else{\ttfamily U+#1}\fi}%
\providecommand{\zatoken}[4]{\setlength{\fboxsep}{1.5pt}\colorbox[rgb]{#1}{\strut\textcolor[rgb]{#2}{#3}}#4}%
"""


def _char(char: str) -> str:
    if char in _SPECIAL:
        return _SPECIAL[char]
    if ord(char) < 0x80:
        return char if char.isprintable() else ''
    if char in _LETTERS:
        return _LETTERS[char]
    decomposed = unicodedata.normalize('NFD', char)
    base, marks = decomposed[:1], decomposed[1:]
    if base.isascii() and base.isalpha() and marks and all(mark in _ACCENTS for mark in marks):
        out = base if base not in 'ij' else '\\' + base
        for mark in marks:
            out = f'\\{_ACCENTS[mark]}{{{out}}}'
        return out
    return f'\\zaglyph{{{ord(char):04X}}}{{{char}}}'


def latex_escape(text: str) -> str:
    """``text`` as LaTeX that typesets it (see the module documentation for non-ASCII characters).

    Parameters
    ----------
    text: str

    Returns
    -------
    str
    """
    return ''.join(_char(char) for char in text)


def _rgb(color) -> str:
    return ','.join(f'{channel / 255:.3f}' for channel in color)


def latex_snippet(heatmaps: Sequence[Heatmap], captions: bool = True) -> str:
    r"""The heatmaps as a LaTeX snippet: per token a ``\zatoken{background}{text colour}{text}{glue}`` box.

    Parameters
    ----------
    heatmaps: sequence of Heatmap
        With their scales resolved.
    captions: bool
        Whether to typeset each heatmap's caption and segment labels above its tokens.

    Returns
    -------
    str
    """
    lines = [_PREAMBLE.rstrip('\n'), r'\begingroup\raggedright\setlength{\parindent}{0pt}%']
    for number, heatmap in enumerate(heatmaps):
        if number:
            lines.append(r'\par\medskip')
        if captions and heatmap.title:
            lines.append(rf'\textbf{{{latex_escape(heatmap.title)}}}\par\smallskip')
        for segment in heatmap.segments:
            if captions and segment.label:
                lines.append(rf'{{\footnotesize\textsc{{{latex_escape(segment.label)}}}}}\par')
            for token, value in zip(segment.tokens, segment.values):
                lead, shown, trail = split_space(token)
                background = relevance_to_rgb(value, heatmap.scale)
                glue = r'\par' if '\n' in token else (r'\ ' if trail else r'\hspace{0.6pt}\allowbreak')
                before = r'\ ' if lead else ''
                lines.append(
                    f'{before}\\zatoken{{{_rgb(background)}}}{{{_rgb(text_color(background))}}}'
                    f'{{{latex_escape(shown)}}}{{{glue}}}%'
                )
            lines.append(r'\par')
    lines.append(r'\endgroup')
    return '\n'.join(lines) + '\n'


def latex_document(snippet: str, packages: Sequence[str] = ()) -> str:
    """A complete document around ``snippet`` (article class, xcolor), to compile as it is.

    Parameters
    ----------
    snippet: str
    packages: sequence of str
        Further packages the snippet needs (``'graphicx'`` for included images).

    Returns
    -------
    str
    """
    extra = ''.join(f'\\usepackage{{{package}}}\n' for package in packages)
    return (
        '\\documentclass{article}\n\\usepackage{xcolor}\n\\usepackage[margin=2cm]{geometry}\n'
        + extra
        + '\\begin{document}\n'
        + snippet
        + '\\end{document}\n'
    )


def save_latex(
    heatmaps: Sequence[Heatmap], path: str | os.PathLike, document: bool = False, captions: bool = True
) -> Path:
    """Write :py:func:`latex_snippet` (or, with ``document``, a complete document) to ``path`` (UTF-8).

    Parameters
    ----------
    heatmaps: sequence of Heatmap
    path: str or os.PathLike
    document: bool
        Write a compilable document instead of a snippet to ``\\input``.
    captions: bool
        See :py:func:`latex_snippet`.

    Returns
    -------
    pathlib.Path
    """
    path = Path(path)
    snippet = latex_snippet(heatmaps, captions)
    path.write_text(latex_document(snippet) if document else snippet, encoding='utf-8')
    return path
