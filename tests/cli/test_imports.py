"""What a command imports before it runs, and what ``import zennit_attn`` imports: the manual (``--help`` of the
program and of each command), ``--version`` and the refusals of bad arguments import neither torch nor transformers
(they took 6 s and more, all of it importing), and ``import zennit_attn`` imports its names on first use (PEP 562).

Each test runs a fresh interpreter and reads its ``sys.modules`` (not the time, which a loaded machine changes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zennit_attn

ROOT = Path(__file__).resolve().parents[2]
#: modules the manual and the argument checks must not import (torch and what imports it)
HEAVY = ('torch', 'transformers', 'captum', 'sklearn', 'zennit', 'numpy', 'PIL', 'safetensors', 'tqdm')
#: the arguments whose handling must not import :py:data:`HEAVY`
MANUALS = [
    ['--help'],
    ['--version'],
    *(
        [command, '--help']
        for command in (
            'explain',
            'generate',
            'demo',
            'explain-dataset',
            'neurons',
            'patching',
            'faithfulness',
            'check',
        )
    ),
]


def python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter in the repository; it prints one JSON value last, which is returned."""
    result = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def heavy_after(runs: list[list[str]]) -> dict:
    """For each ``argv`` of ``runs`` in turn, in one fresh interpreter: its exit status, the number of lines it
    printed and the modules of :py:data:`HEAVY` loaded after it."""
    return python(f"""
        import contextlib, io, json, sys
        from zennit_attn.cli import main
        found = []
        for argv in {runs!r}:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
            found.append([argv, code, len(out.getvalue().splitlines()), err.getvalue().strip(),
                          sorted(name for name in {HEAVY!r} if name in sys.modules)])
        print(json.dumps(found))
        """)


def test_manuals_import_no_torch():
    for argv, code, lines, err, heavy in heavy_after(MANUALS):
        assert code == 0 and lines >= 1 and err == '', (argv, code, err)
        assert heavy == [], f'zennit-attn {" ".join(argv)} imports {heavy}'


def test_refusals_import_no_torch(tmp_path):
    """Bad arguments are refused (exit status 2, one line) without importing torch, let alone loading a model;
    also the combinations that used to be refused by the library after loading."""
    folder = tmp_path / 'model'  # a model folder as the checks see it (it would not load)
    folder.mkdir()
    (folder / 'config.json').write_text('{"model_type": "llava"}')
    (folder / 'tokenizer.json').write_text('{}')
    picture = tmp_path / 'x.png'
    picture.write_bytes(b'not read by the checks')
    texts = tmp_path / 'texts.jsonl'
    texts.write_text('{"text": "The bear"}\n')
    runs = {
        '--top must be 0 or more': ['explain', '--prompt', 'x', '--top', '-1'],
        '--method input_x_gradient is not one': [
            'explain',
            '--prompt',
            'x',
            '--image',
            str(picture),
            '--model',
            str(folder),
            '--method',
            'input_x_gradient',
        ],
        '--method gradcam is not one': [
            'generate',
            '--prompt',
            'x',
            '--image',
            str(picture),
            '--model',
            str(folder),
            '--method',
            'gradcam',
        ],
        "--contrast is the --target itself (' b')": ['explain', '--prompt', 'a', '--target', ' b', '--contrast', ' b'],
        '--contrast is the --target itself (id:5)': [
            'explain',
            '--prompt',
            'a',
            '--target',
            'id:5',
            '--contrast',
            'id:5',
        ],
        '--image needs --model FOLDER': ['explain', '--prompt', 'x', '--image', str(picture)],
        '--contrast does not apply with --image': [
            'explain',
            '--prompt',
            'x',
            '--image',
            str(picture),
            '--model',
            str(folder),
            '--contrast',
            'id:3',
        ],
        '--method atman does not record latent relevance': ['neurons', '--prompt', 'x', '--method', 'atman'],
        '--checkpointing saves memory of a backward pass, which --method atman does not do': [
            'explain-dataset',
            '--input',
            str(texts),
            '--output',
            str(tmp_path / 'out'),
            '--method',
            'atman',
            '--checkpointing',
        ],
        "--input '": ['explain-dataset', '--input', str(tmp_path / 'missing.jsonl'), '--output', str(tmp_path)],
        "--param 'step': method integrated_gradients takes steps, baseline": [
            'explain',
            '--prompt',
            'x',
            '--method',
            'integrated_gradients',
            '--param',
            'step=3',
        ],
        '--composite applies to the LRP methods': [
            'explain',
            '--prompt',
            'x',
            '--method',
            'gradcam',
            '--composite',
            'cplrp',
        ],
        'is not a finished explain-dataset output': ['faithfulness', '--explanations', str(tmp_path)],
        '--top must be at least 1': ['demo', '--top', '0'],
        'is a folder without config.json': ['check', '--model', str(tmp_path)],
        "--model 'no/such/model': no such file or folder, and not a model_type": ['check', '--model', 'no/such/model'],
        '--param for method kernelshap: seed must be an integer or None, got 0.5': [
            'explain',
            '--prompt',
            'x',
            '--method',
            'kernelshap',
            '--param',
            'seed=0.5',
        ],
    }
    found = heavy_after(list(runs.values()))
    for (message, _), (argv, code, lines, err, heavy) in zip(runs.items(), found):
        assert code == 2 and lines == 0, (argv, code, err)
        assert err.startswith('zennit-attn: error: ') and message in err and '\n' not in err, (argv, err)
        assert heavy == [], f'zennit-attn {" ".join(argv)} imports {heavy} before refusing'
    assert not (tmp_path / 'out').exists()


@pytest.mark.slow  # fresh interpreters (about 20 s)
def test_import_zennit_attn_loads_names_on_first_use():
    found = python("""
        import json, sys
        heavy = lambda: sorted(name for name in ('torch', 'transformers', 'captum', 'sklearn', 'zennit')
                               if name in sys.modules)
        import zennit_attn
        after_import = heavy()
        listed = sorted(set(zennit_attn.__all__) - set(dir(zennit_attn)))
        explain = zennit_attn.explain
        from zennit_attn import explain as imported
        import zennit_attn.explain  # the submodule of the same name: the package's name stays the function
        import zennit_attn.workflows.generation
        print(json.dumps({'after_import': after_import, 'not_in_dir': listed, 'after_use': heavy(),
                          'explain': [explain.__module__, callable(explain), imported is explain,
                                      zennit_attn.explain is explain]}))
        """)
    assert found['after_import'] == [], f'import zennit_attn imports {found["after_import"]}'
    assert found['not_in_dir'] == []
    assert {'torch', 'transformers'} <= set(found['after_use'])
    assert found['explain'] == ['zennit_attn.explain', True, True, True]


@pytest.mark.slow  # fresh interpreters (about 20 s)
def test_the_submodule_explain_first():
    """``zennit_attn.explain`` is the function also where the submodule was imported before the name was used (as
    the command line's run step does)."""
    found = python("""
        import json
        from zennit_attn.explain import encode_texts
        import zennit_attn
        from zennit_attn import explain
        print(json.dumps([zennit_attn.explain is explain, callable(explain), explain.__name__,
                          zennit_attn.explain.__module__, encode_texts.__module__]))
        """)
    assert found == [True, True, 'explain', 'zennit_attn.explain', 'zennit_attn.explain']


def test_public_names_in_this_process():
    """The names of ``__all__`` resolve (to the objects of their modules), ``dir()`` lists them, a submodule
    resolves on first use, and an unknown name is an AttributeError."""
    from zennit_attn import explain as function
    from zennit_attn.results import explanation
    from zennit_attn.results import similarity as similarity_result
    from zennit_attn.workflows import bilrp, dataset, diagnostics, generation, sources

    modules = {
        'explain_dataset': dataset,
        'load_explanations': dataset,
        'explain_generation': generation,
        'Explanation': explanation,
        'ImageExplanation': explanation,
        'GenerationExplanation': generation,
        'conservation': diagnostics,
        'ConservationReport': diagnostics,
        'explain_similarity': bilrp,
        'SimilarityExplanation': similarity_result,
        'explain_sources': sources,
        'SourceExplanation': sources,
        'SourceCiter': sources,
    }
    for name, module in modules.items():
        assert getattr(zennit_attn, name) is getattr(module, name)
    assert callable(function) and function.__module__ == 'zennit_attn.explain' and zennit_attn.explain is function
    assert set(zennit_attn.__all__) <= set(dir(zennit_attn))
    assert zennit_attn.__version__ == '0.1.0' and 'explain' in zennit_attn.__all__
    assert zennit_attn.methods.registry.METHODS  # a submodule on first use
    with pytest.raises(AttributeError, match="has no attribute 'frobnicate'"):
        zennit_attn.frobnicate  # noqa: B018
    namespace = {}
    exec('from zennit_attn import *', namespace)  # noqa: S102
    assert set(zennit_attn.__all__) <= set(namespace)
