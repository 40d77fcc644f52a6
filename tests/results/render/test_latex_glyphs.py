"""LaTeX snippets typeset every token as its text: a tab token compiles with xcolor alone, and ``--``/``---`` tokens
stay hyphens (not en and em dashes) in pdfLaTeX and LuaLaTeX."""

from __future__ import annotations

import shutil

import pypdf
import pytest
import torch

from tests.results.render.conftest import compile_latex
from zennit_attn import Explanation


class _Tokenizer:
    """One text per id."""

    all_special_ids: list[int] = []

    def __init__(self, texts: dict[int, str]):
        self.texts = texts

    def decode(self, ids, **kwargs):
        return ''.join(self.texts[int(token)] for token in ids)


def _compile(tmp_path, engine: str, texts: dict[int, str]) -> tuple[int, str, str]:
    """``(return code, log tail, text of the PDF)`` of a document holding the snippet of tokens ``texts``."""
    path = shutil.which(engine)
    if path is None:
        pytest.skip(f'{engine} not found: run `make system` as root, or apt-get install texlive-latex-recommended')
    ids = sorted(texts)
    explanation = Explanation(
        relevance=torch.linspace(-1.0, 1.0, len(ids))[None],
        embedding_relevance=None,
        target=torch.tensor([ids[0]]),
        logit=torch.tensor([1.0]),
        position=torch.tensor([len(ids) - 1]),
        input_ids=torch.tensor([ids]),
    )
    explanation.save(tmp_path / 'tokens.tex', tokenizer=_Tokenizer(texts), captions=False)
    result = compile_latex(path, tmp_path, 'tokens.tex')
    if result.returncode:
        return result.returncode, result.stdout[-3000:], ''
    return 0, '', pypdf.PdfReader(tmp_path / 'main.pdf').pages[0].extract_text()


@pytest.mark.parametrize('engine', ['pdflatex', 'lualatex'])
def test_a_tab_token_compiles_with_xcolor_alone(tmp_path, engine):
    code, log, content = _compile(tmp_path, engine, {4: 'a', 5: '\t', 6: 'b', 7: ' \x1b'})
    assert code == 0, log  # before: '! Undefined control sequence' (\rightarrowtail is amssymb's)
    assert 'a' in content and 'b' in content


@pytest.mark.parametrize('engine', ['pdflatex', 'lualatex'])
def test_hyphen_tokens_stay_hyphens(tmp_path, engine):
    code, log, content = _compile(tmp_path, engine, {4: 'a', 5: ' --', 6: ' ---', 7: ' x-y'})
    assert code == 0, log
    assert '\u2013' not in content and '\u2014' not in content  # before: LuaLaTeX made '--' and '---' dashes
    assert '---' in content and 'x-y' in content
