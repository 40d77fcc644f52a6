"""HTML heatmaps: fragments for Jupyter (``_repr_html_``), standalone pages, and the interactive page of a generated
answer (click or hover a generated token to see what it was generated from).

Everything is inline (CSS, and for the interactive page a short script and its data); nothing is loaded from
elsewhere. Colours come from :py:func:`~zennit_attn.results.render.colors.relevance_to_rgb`; the interactive page looks
up the same colour table, so that its colours equal those of every other format. Fragments set no page colours and
inherit the text colour, so that they read on light and dark notebook themes; standalone pages follow the
reader's light or dark preference (``prefers-color-scheme``).
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from collections.abc import Sequence

from .colors import LEVELS, color_table, css_rgb, relevance_to_rgb, text_color
from .layout import Heatmap, Segment, format_relevance, split_space
from .tokens import display_token

__all__ = [
    'CSS',
    'token_spans',
    'legend',
    'heatmap_fragment',
    'fragment',
    'page',
    'figures_html',
    'generation_fragment',
]

CSS = """
.za { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; line-height: 1.45; }
.za h1 { font-size: 1.35em; margin: 0 0 0.2em; }
.za .za-sub { opacity: 0.75; margin: 0 0 0.8em; }
.za .za-heatmap { margin: 0 0 1.4em; }
.za .za-caption { font-weight: 600; margin: 0 0 0.35em; }
.za .za-caption code, .za .za-info code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-weight: 400; padding: 0 0.25em; border-radius: 3px; background: rgba(127, 127, 127, 0.18); }
.za .za-label { font-size: 0.8em; text-transform: uppercase; letter-spacing: 0.06em; opacity: 0.7;
  margin: 0.4em 0 0.1em; }
.za .za-tokens { font-size: 1.08em; line-height: 2.05; white-space: pre-wrap; word-break: break-word;
  padding: 0.45em 0.6em; border: 1px solid rgba(127, 127, 127, 0.35); border-radius: 6px; }
.za .za-t { padding: 0.14em 0.16em; margin: 0 1px; border-radius: 3px; -webkit-print-color-adjust: exact;
  print-color-adjust: exact; }
.za .za-legend { display: flex; align-items: center; gap: 0.55em; margin: 0.45em 0 0; font-size: 0.85em; }
.za .za-bar { width: 14em; height: 0.85em; border-radius: 3px; border: 1px solid rgba(127, 127, 127, 0.5);
  -webkit-print-color-adjust: exact; print-color-adjust: exact; }
.za .za-note { opacity: 0.72; font-size: 0.85em; }
.za .za-unscaled { outline: 1px dashed rgba(127, 127, 127, 0.95); outline-offset: 1px; }
.za .za-gen { cursor: pointer; box-shadow: inset 0 -2px 0 rgba(127, 127, 127, 0.9); }
.za .za-gen:hover { outline: 1px dashed rgba(127, 127, 127, 0.9); }
.za .za-gen:focus-visible { outline: 2px solid #e69f00; }
.za .za-selected, .za .za-selected:hover { outline: 2px solid #e69f00; outline-offset: 1px;
  box-shadow: inset 0 -2px 0 #e69f00; }
.za .za-later { opacity: 0.38; }
.za .za-controls { display: flex; flex-wrap: wrap; align-items: center; gap: 0.6em; margin: 0 0 0.6em; }
.za button.za-answer { font: inherit; font-size: 0.9em; padding: 0.2em 0.7em; border-radius: 5px; cursor: pointer;
  color: inherit; background: rgba(127, 127, 127, 0.15); border: 1px solid rgba(127, 127, 127, 0.6); }
.za button.za-answer[aria-pressed="true"] { border-color: #e69f00; box-shadow: 0 0 0 1px #e69f00; }
.za .za-info { margin: 0.5em 0 0; min-height: 1.5em; }
"""

_PAGE_CSS = """
body { margin: 2em auto; max-width: 62em; padding: 0 1.2em; color: #15171a; background: #ffffff; }
@media (prefers-color-scheme: dark) { body { color: #e6e6e6; background: #16181c; } }
"""


def _gradient() -> str:
    table = color_table()
    stops = [css_rgb(table[round(index * (len(table) - 1) / 10)]) for index in range(11)]
    return f'linear-gradient(to right, {", ".join(stops)})'


def legend(scale: float, note: str | None = None) -> str:
    """The colour legend: ``-scale``, the colour bar, ``+scale`` and a note.

    Parameters
    ----------
    scale: float
        Relevance of full colour.
    note: str, optional
        Text after the bar (HTML-escaped); default explains the colours.

    Returns
    -------
    str
    """
    note = 'blue: against, grey: 0, red: for the explained output' if note is None else note
    return (
        f'<div class="za-legend"><span class="za-lo">{html.escape(format_relevance(-scale))}</span>'
        f'<span class="za-bar" style="background: {_gradient()}"></span>'
        f'<span class="za-hi">{html.escape(format_relevance(scale))}</span>'
        f'<span class="za-note">{html.escape(note)}</span></div>'
    )


def token_spans(segment: Segment, scale: float, extra=None) -> str:
    """The tokens of ``segment`` as coloured ``<span>`` boxes, their spaces between the boxes.

    Each box has the token's colour (:py:func:`relevance_to_rgb`) with black or white text, a tooltip with its
    position and relevance and ``data-i`` = the index of the token in the segment; a line-break token ends its line.

    Parameters
    ----------
    segment: Segment
    scale: float
        Relevance of full colour.
    extra: callable, optional
        ``extra(index) -> (classes, attributes)`` added to token ``index``'s span.

    Returns
    -------
    str
    """
    parts = []
    for index, (token, value, positions) in enumerate(zip(segment.tokens, segment.values, segment.positions)):
        lead, shown, trail = split_space(token)
        background = relevance_to_rgb(value, scale)
        where = f'position {positions[0]}' if len(positions) == 1 else f'positions {positions[0]}-{positions[-1]}'
        tooltip = f'{where} {display_token(token)!r}: relevance {format_relevance(value)}'
        classes, attributes = extra(index) if extra is not None else ('', '')
        parts.append(
            f'{lead}<span class="za-t{classes}" data-i="{index}"{attributes} style="background: '
            f'{css_rgb(background)}; color: {css_rgb(text_color(background))}" title="{html.escape(tooltip)}">'
            f'{html.escape(shown)}</span>{trail}'
        )
        if '\n' in token:
            parts.append('<br>')
    return ''.join(parts)


def _marker(heatmap: Heatmap, part: int):
    """``extra`` of :py:func:`token_spans` that marks the tokens left out of the colour scale (class ``za-unscaled``,
    a dashed outline), or None."""
    marked = {index for segment, index in heatmap.unscaled if segment == part}
    if not marked:
        return None
    return lambda index: (' za-unscaled', ' data-unscaled="1"') if index in marked else ('', '')


def heatmap_fragment(heatmap: Heatmap, legend_note: str | None = None) -> str:
    """One heatmap as a ``<div class="za-heatmap">``: caption, labelled segments, legend.

    Parameters
    ----------
    heatmap: Heatmap
    legend_note: str, optional
        See :py:func:`legend`.

    Returns
    -------
    str
    """
    parts = ['<div class="za-heatmap">']
    if heatmap.title:
        parts.append(f'<div class="za-caption">{html.escape(heatmap.title)}</div>')
    for part, segment in enumerate(heatmap.segments):
        if segment.label:
            parts.append(f'<div class="za-label">{html.escape(segment.label)}</div>')
        parts.append(f'<div class="za-tokens">{token_spans(segment, heatmap.scale, _marker(heatmap, part))}</div>')
    total = sum(value for value in heatmap.values if math.isfinite(value))
    parts.append(legend(heatmap.scale, legend_note))
    parts.append(
        f'<div class="za-note">{len(heatmap.values)} tokens, relevance sum '
        f'{html.escape(format_relevance(total))}; hover a token for its relevance</div>'
    )
    parts.append('</div>')
    return ''.join(parts)


def fragment(body: str, title: str | None = None, subtitle: str | None = None) -> str:
    """``body`` in a ``<div class="za">`` with the style sheet, for Jupyter or for embedding in a page.

    Parameters
    ----------
    body: str
        HTML.
    title, subtitle: str, optional
        Heading and a line under it (escaped).

    Returns
    -------
    str
    """
    head = ''
    if title:
        head += f'<h1>{html.escape(title)}</h1>'
    if subtitle:
        head += f'<p class="za-sub">{html.escape(subtitle)}</p>'
    return f'<div class="za"><style>{CSS}</style>{head}{body}</div>'


def page(body: str, title: str = 'Token relevance', subtitle: str | None = None) -> str:
    """A standalone HTML document around :py:func:`fragment` (light or dark as the reader prefers).

    Parameters
    ----------
    body: str
        HTML.
    title: str
        Document title and heading.
    subtitle: str, optional

    Returns
    -------
    str
    """
    return '\n'.join(
        [
            '<!DOCTYPE html>',
            '<html lang="en">',
            '<head>',
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            '<meta name="color-scheme" content="light dark">',
            f'<title>{html.escape(title)}</title>',
            f'<style>{_PAGE_CSS}</style>',
            '</head>',
            '<body>',
            fragment(body, title, subtitle),
            '</body>',
            '</html>',
            '',
        ]
    )


_SCRIPT = """
(function () {
  var script = document.currentScript;
  var root = script && script.parentElement && script.parentElement.classList.contains('za')
    ? script.parentElement : document.getElementById(%(id)s);
  var data = JSON.parse(root.querySelector('script.za-data').textContent);
  var spans = root.querySelectorAll('.za-tokens .za-t');
  var gens = root.querySelectorAll('.za-gen');
  var button = root.querySelector('button.za-answer');
  var info = root.querySelector('.za-info');
  var pinned = data.views.length - 1;
  function fmt(v) { var s = Number(v).toPrecision(4); s = String(Number(s)); return (v >= 0 ? '+' : '') + s; }
  function level(v, scale) {
    if (!(scale > 0) || !isFinite(scale) || isNaN(v)) { return 0; }
    var f = Math.max(-1, Math.min(1, v / scale));
    return Math.sign(f) * Math.floor(Math.abs(f) * %(levels)d + 0.5);
  }
  function esc(s) { var d = document.createElement('span'); d.textContent = s; return d.innerHTML; }
  var pictures = root.querySelectorAll('img.za-overlay');
  var captions = root.querySelectorAll('.za-overlay-caption');
  function show(k) {
    var view = data.views[k];
    for (var j = 0; view.images && j < pictures.length && j < view.images.length; j++) {
      pictures[j].src = view.images[j].src;
      pictures[j].alt = captions[j].textContent = view.images[j].caption;
    }
    for (var i = 0; i < spans.length; i++) {
      var v = view.values[i];
      var lv = level(v, view.scale) + %(levels)d;
      spans[i].style.background = data.colors[lv];
      spans[i].style.color = data.texts[lv];
      spans[i].title = data.where[i] + ': relevance ' + fmt(v);
      spans[i].classList.toggle('za-later', i >= view.upto);
    }
    for (var g = 0; g < gens.length; g++) {
      gens[g].classList.toggle('za-selected', Number(gens[g].dataset.view) === k);
    }
    button.setAttribute('aria-pressed', k === data.views.length - 1 ? 'true' : 'false');
    root.querySelector('.za-lo').textContent = fmt(-view.scale);
    root.querySelector('.za-hi').textContent = fmt(view.scale);
    var order = view.values.map(function (v, i) { return i; }).filter(function (i) { return i < view.upto; });
    order.sort(function (a, b) { return view.values[b] - view.values[a]; });
    var top = order.slice(0, 3).map(function (i) {
      return '<code>' + esc(data.shown[i]) + '</code> ' + fmt(view.values[i]);
    });
    info.innerHTML = esc(view.label) + (top.length ? '; most relevant: ' + top.join(', ') : '');
    root.dataset.view = String(k);
  }
  for (var g = 0; g < gens.length; g++) {
    (function (span) {
      var k = Number(span.dataset.view);
      span.addEventListener('mouseenter', function () { show(k); });
      span.addEventListener('mouseleave', function () { show(pinned); });
      span.addEventListener('click', function () { pinned = k; show(k); });
      span.addEventListener('keydown', function (event) {
        if (event.key === 'Enter' || event.key === ' ') { pinned = k; show(k); event.preventDefault(); }
        if (event.key === 'ArrowRight' || event.key === 'ArrowLeft') {
          var next = gens[Math.max(0, Math.min(gens.length - 1,
            Array.prototype.indexOf.call(gens, span) + (event.key === 'ArrowRight' ? 1 : -1)))];
          next.focus(); pinned = Number(next.dataset.view); show(pinned); event.preventDefault();
        }
      });
    })(gens[g]);
  }
  button.addEventListener('click', function () { pinned = data.views.length - 1; show(pinned); });
  show(pinned);
})();
"""


def figures_html(figures: Sequence[dict]) -> str:
    """A row of images with captions: ``figures`` holds dicts with ``src`` (a URL, e.g. ``data:image/png;base64,...``),
    ``caption``, ``width`` and ``height``. The images (``img.za-overlay``) are drawn pixelated; a caption wraps
    within its image's width (the layout does not move when a caption changes)."""
    parts = ['<div class="za-images" style="display:flex;flex-wrap:wrap;gap:1em;margin:0 0 1em">']
    for figure in figures:
        caption = html.escape(str(figure['caption']))
        parts.append(
            f'<figure style="margin:0;width:{int(figure["width"])}px"><img class="za-overlay" '
            f'src="{html.escape(str(figure["src"]))}" '
            f'alt="{caption}" width="{int(figure["width"])}" height="{int(figure["height"])}" '
            f'style="image-rendering:pixelated"><figcaption class="za-note za-overlay-caption">{caption}'
            '</figcaption></figure>'
        )
    parts.append('</div>')
    return ''.join(parts)


def generation_fragment(
    tokens: Sequence[str],
    positions: Sequence[Sequence[int]],
    views: Sequence[dict],
    clickable: Sequence[int | None],
    caption: str | None = None,
) -> str:
    """The interactive heatmap of a generated answer (a ``<div class="za">`` with its script).

    All tokens (prompt and answer) are shown in one text. Each generated token (or word) is a button: hovering it
    shows its heatmap, clicking (or Enter) keeps it, the arrow keys step through the answer; the button "whole
    answer" shows the heatmap of the sum of all generated logits, which is also what is shown first and what a
    reader without scripts sees. Tokens the selected one was not generated from are faded.

    Parameters
    ----------
    tokens: sequence of str
        The texts of all shown tokens (or words), prompt then answer.
    positions: sequence of sequence of int
        Each shown token's positions (for tooltips).
    views: sequence of dict
        One per generated token (or word), then the whole answer last: ``values`` (one relevance per shown token),
        ``scale`` (colour scale), ``upto`` (index of the first shown token it was not generated from), ``label``
        (text of the info line), and for an answer to images ``images``: the view's image overlays (dicts as for
        :py:func:`figures_html`), shown beside the text (those of the whole answer first) and switched with the
        view.
    clickable: sequence of int or None
        For each shown token, the index of its view, or None for prompt tokens.
    caption: str, optional
        A line above the text.

    Returns
    -------
    str
    """
    answer = views[-1]
    segment = Segment(list(tokens), list(answer['values']), positions=[list(p) for p in positions])

    def extra(index):
        view = clickable[index]
        if view is None:
            return ('', '')
        selected = ' za-selected' if view == len(views) - 1 else ''
        return (f' za-gen{selected}', f' data-view="{view}" tabindex="0" role="button"')

    spans = token_spans(segment, answer['scale'], extra)
    where = [
        (f'position {p[0]}' if len(p) == 1 else f'positions {p[0]}-{p[-1]}') + f' {display_token(t)!r}'
        for t, p in zip(tokens, positions)
    ]
    table = color_table()
    data = {
        'views': [
            dict(
                {
                    'values': [float(v) if math.isfinite(float(v)) else 0.0 for v in view['values']],
                    'scale': float(view['scale']),
                    'upto': int(view['upto']),
                    'label': str(view['label']),
                },
                **(
                    {
                        'images': [
                            {'src': str(image['src']), 'caption': str(image['caption'])} for image in view['images']
                        ]
                    }
                    if view.get('images')
                    else {}
                ),
            )
            for view in views
        ],
        'colors': [css_rgb(color) for color in table],
        'texts': [css_rgb(text_color(color)) for color in table],
        'where': where,
        'shown': [split_space(token)[1] for token in tokens],
    }
    payload = json.dumps(data, ensure_ascii=True).replace('</', '<\\/')
    uid = 'za-gen-' + hashlib.sha1(payload.encode()).hexdigest()[:12]  # the same page for the same explanation
    script = _SCRIPT % {'id': json.dumps(uid), 'levels': LEVELS}
    controls = (
        '<div class="za-controls"><button type="button" class="za-answer" aria-pressed="true">whole answer'
        '</button><span class="za-note">click or hover a generated (underlined) token to see what it was '
        'generated from; arrow keys step through the answer</span></div>'
    )
    caption = f'<div class="za-caption">{html.escape(caption)}</div>' if caption else ''
    body = (
        f'<div class="za-heatmap">{caption}{controls}'
        f'<div class="za-tokens">{spans}</div><div class="za-info">{html.escape(answer["label"])}</div>'
        f'{legend(answer["scale"])}</div>'
    )
    if answer.get('images'):  # the overlays beside the text
        body = (
            f'<div style="display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start"><div>'
            f'{figures_html(answer["images"])}</div><div style="flex:1 1 24em">{body}</div></div>'
        )
    return (
        f'<div class="za" id="{uid}" data-view="{len(views) - 1}"><style>{CSS}</style>{body}'
        f'<script type="application/json" class="za-data">{payload}</script><script>{script}</script></div>'
    )
