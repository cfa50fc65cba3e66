"""The figures' shared pieces (splitlab.plots) on the CPU: colour-blind-safe colours and maps, hatched missing
cells, one colour per line, labels that do not overlap and text no smaller than ``plots.MIN_FONT_PT`` at the drawn
size; and the JupyterLab setting that opens notebooks/*.py as notebooks (``make lab``), checked through a real
server's REST API."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from splitlab import planners, plots  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))

# Machado, Oliveira & Fernandes (2009): full-severity dichromacy in linear RGB.
_CVD = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}


def _lin(c):
    c = np.asarray(c, dtype=float)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear_rgb):
    """CIE L*a*b* (D65) of a linear-RGB colour."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear_rgb
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > 216 / 24389, np.cbrt(np.clip(t, 0, None)), (24389 / 27 * t + 16) / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _seen(color, deficiency=None):
    """L*a*b* of ``color`` as seen with ``deficiency`` (None: normal vision)."""
    lin = _lin(to_rgb(color))
    if deficiency:
        lin = np.clip(np.asarray(_CVD[deficiency]) @ lin, 0, 1)
    return _lab(lin)


def _delta_e(a, b, deficiency=None) -> float:
    return float(np.linalg.norm(_seen(a, deficiency) - _seen(b, deficiency)))


@pytest.fixture(autouse=True)
def _theme():
    plots.setup()
    yield
    plt.close("all")


def _draw_twice(fig):
    # twice: the draw-time layout must reach the same answer on every draw (a hidden text measures as a unit box)
    fig.canvas.draw()
    fig.canvas.draw()


def _visible_boxes(texts, fig):
    r = fig.canvas.get_renderer()
    return [t.get_window_extent(r) for t in texts if t.get_visible() and t.get_text().strip()]


# --- colours ---------------------------------------------------------------------------------------------------

def test_every_registered_planner_has_its_own_colour_and_marker():
    names = planners.names()
    assert "flashinfer-0.7.4" in names
    colours = [plots.PLANNER_COLORS[n].lower() for n in names]
    assert len(set(colours)) == len(names)
    assert len({plots.planner_marker(n) for n in names}) == len(names)
    # planners registered later than the palette's table still get colours unused by the others
    more = [*names, *(f"new_rule_{i}" for i in range(12))]
    assert len({c.lower() for c in plots._palette(more).values()}) == len(more)


@pytest.mark.parametrize("deficiency", [None, "protanopia", "deuteranopia", "tritanopia"])
def test_planner_colours_stay_apart_for_colour_blind_readers(deficiency):
    # CIE76 distance >= 12 between any two planners' colours, also as a dichromat sees them (tab10's red and green,
    # the planner colours before, were 7 apart for a deuteranope)
    pairs = itertools.combinations(planners.names(), 2)
    worst = min((_delta_e(plots.PLANNER_COLORS[a], plots.PLANNER_COLORS[b], deficiency), a, b) for a, b in pairs)
    assert worst[0] >= 12, worst


def test_lines_of_one_figure_get_distinct_colours():
    # the seeds page: cake as it plans for the H200 and for four other devices, all measured on the H200
    labels = ["flashinfer", "flashinfer@gb10", "flashinfer@mi355x", "flashinfer@rtx-pro-6000", "flashinfer@rtx5090"]
    styles = plots.planner_styles(labels)
    assert list(styles) == plots.planner_order(labels)
    assert len({s["color"].lower() for s in styles.values()}) == len(labels)
    assert styles["flashinfer"]["color"] == plots.planner_color("flashinfer")
    assert all(styles[x]["linestyle"] != "-" and styles[x]["markerfacecolor"] == "none" for x in labels[1:])
    every = [*planners.names(), *(f"{n}@mi355x" for n in planners.names()), "modular@rtx5090"]
    assert len({c.lower() for c in plots.planner_palette(every).values()}) == len(every)


def test_ecdf_draws_one_colour_per_label():
    fig, ax = plt.subplots()
    labels = ["flashinfer", "flashinfer@gb10", "flashinfer@mi355x", "aiter", "aiter@gb10"]
    plots.ecdf(ax, {lab: np.linspace(1, 2, 5) + i for i, lab in enumerate(labels)})
    assert len({to_rgb(line.get_color()) for line in ax.get_lines()}) == len(labels)


def test_legends_lie_beside_the_data_never_on_it():
    """The ECDF pages: one legend for panels that share their planners (``legend_outside(fig)``, planners in their
    usual order), or one beside a single axes; neither covers any axes' data area."""
    fig, axes = plt.subplots(1, 3, figsize=plots.figsize(10.6, 3.4))
    for i, ax in enumerate(axes):
        plots.ecdf(ax, {lab: np.linspace(1, 4, 50) + i for lab in ("splitlab", "flex", "flashinfer")[: i + 1]},
                   counts=False)
    leg = plots.legend_outside(fig)
    assert [t.get_text() for t in leg.get_texts()] == plots.planner_order(["splitlab", "flex", "flashinfer"])
    fig.canvas.draw()
    box = leg.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in axes)
    fig2, ax2 = plt.subplots(figsize=(7.0, 3.3))
    plots.ecdf(ax2, {"flashinfer": np.linspace(1, 4, 50), "flashinfer@gb10": np.linspace(2, 5, 50)})
    leg2 = plots.legend_outside(ax2)
    fig2.canvas.draw()
    assert not leg2.get_window_extent().overlaps(ax2.get_window_extent())
    assert [t.get_text() for t in leg2.get_texts()] == ["flashinfer (n=50)", "flashinfer@gb10 (n=50)"]
    plt.close(fig)
    plt.close(fig2)


def test_tables_show_no_nan_no_empty_column_and_no_row_numbers():
    from splitlab import notebook

    t = pd.DataFrame(dict(shape=["gqa B1", "mla B2"], splits=[4.0, np.nan], regret=[1.0, 1.23456],
                          reason=["", ""], note=[None, None]))
    page = notebook.table_html(t)
    assert "NaN" not in page and "nan" not in page and f">{notebook.MISSING}<" in page
    assert "reason" not in page and "note" not in page  # empty in every row: left out
    assert ">4<" in page and ">1.000<" in page and ">1.235<" in page  # a count stays whole, a ratio keeps digits
    assert ">0<" not in page and ">1<" not in page  # no row numbers
    assert "&lt;b&gt;" in notebook.table_html(pd.DataFrame({"x": ["<b>"]}))  # text is escaped


def test_series_styles_pair_colour_and_marker():
    st = plots.series_styles([16, 32, 64, 96, 128])
    assert len({s["color"] for s in st.values()}) == 5 and len({s["marker"] for s in st.values()}) == 5


# --- colour maps -----------------------------------------------------------------------------------------------

def _cmaps_named_in(text: str) -> list[str]:
    names = re.findall(r"cmap\s*=\s*[\"']([^\"']+)[\"']", text)
    for const in re.findall(r"cmap\s*=\s*plots\.([A-Z_]+)", text):
        names.append(getattr(plots, const))
    return names


def test_no_red_green_colour_map_in_the_plots_or_the_notebooks():
    import seaborn  # noqa: F401  (registers rocket and mako)

    used = []
    for f in NOTEBOOKS:
        used += [(f.name, c) for c in _cmaps_named_in(f.read_text())]
    for fn in (plots.heatmap, plots.log2_heatmap):
        used.append((fn.__name__, inspect.signature(fn).parameters["cmap"].default))
    used += [("plots", c) for c in (plots.SEQUENTIAL_CMAP, plots.FILL_CMAP, plots.RATIO_CMAP, plots.REGRET_CMAP)]
    assert any(name == "waves.py" for name, _ in used) and any(name == "cta_latency.py" for name, _ in used)
    bad = [(where, c) for where, c in used if c not in plots.SAFE_CMAPS]
    assert not bad
    assert not {"RdYlGn", "RdYlGn_r", "PiYG", "PRGn", "RdGy", "jet", "rainbow"} & plots.SAFE_CMAPS
    for c in plots.SAFE_CMAPS:
        assert c in matplotlib.colormaps, c


def test_ratio_map_runs_blue_to_orange_through_a_light_centre():
    cmap = matplotlib.colormaps[plots.RATIO_CMAP]
    lo, mid, hi = (np.asarray(cmap(x)[:3]) for x in (0.0, 0.5, 1.0))
    assert lo[2] > lo[0] and hi[0] > hi[2]  # blue below 1x, orange above
    light = [_seen(cmap(x)[:3])[0] for x in np.linspace(0, 1, 21)]
    assert np.argmax(light) == 10 and light[10] > 90  # lightest at 1x
    assert all(np.diff(light[:11]) > 0) and all(np.diff(light[10:]) < 0)
    for deficiency in _CVD:  # the two ends stay apart for dichromats
        assert _delta_e(lo, hi, deficiency) > 30, deficiency


# --- heatmaps --------------------------------------------------------------------------------------------------

def _ratio_table(rows, cols, missing=()):
    rng = np.random.default_rng(0)
    t = pd.DataFrame(2.0 ** rng.uniform(-1, 1, (len(rows), len(cols))), index=rows, columns=cols)
    t.iloc[0, 0] = 1.0
    for i, j in missing:
        t.iloc[i, j] = np.nan
    return t


def test_missing_cells_are_hatched_grey_not_the_colour_of_one():
    fig, ax = plt.subplots(figsize=(6, 4))
    t = _ratio_table([1, 2, 4, 8], [1024, 4096, 16384], missing=[(2, 1), (3, 2)])
    hm = plots.log2_heatmap(ax, t, cmap=plots.RATIO_CMAP, log_color=True, vmin=0.5, vmax=2, annot=t)
    assert len(hm.missing) == 2
    one = hm.mesh.to_rgba(np.array([1.0]))[0][:3]
    for patch in hm.missing:
        assert patch.get_hatch() and patch.get_visible()
        assert _delta_e(patch.get_facecolor()[:3], one) > 20  # grey and hatched, never the 1.0x colour
    assert {(p.get_x() + 0.5, p.get_y() + 0.5) for p in hm.missing} == {(1.0, 2.0), (2.0, 3.0)}
    assert np.ma.getmaskarray(hm.mesh.get_array()).sum() == 2  # the colour scale leaves them out
    _draw_twice(fig)
    assert len(hm.numbers.texts) == t.size - 2  # no number in a missing cell

    fig, ax = plt.subplots(figsize=(7, 3))  # the categorical heatmap (kernel x planner)
    t = pd.DataFrame({"aiter": [np.nan, 1.3], "modular": [1.2, 7.6]}, index=["gqa_decode", "mla_decode"])
    hm = plots.heatmap(ax, t, annot=t, cmap=plots.REGRET_CMAP, log_color=True, vmin=1.0)
    assert len(hm.missing) == 1 and hm.missing[0].get_hatch()
    assert [x.get_text() for x in ax.get_xticklabels()] == ["aiter", "modular"]


def test_cell_numbers_fit_or_are_left_out():
    fig, (a, b) = plt.subplots(1, 2, figsize=plots.figsize(10, 4))
    roomy = plots.log2_heatmap(a, _ratio_table([1, 2, 4], [1, 2, 4]), annot=_ratio_table([1, 2, 4], [1, 2, 4]))
    rows = list(range(1, 41))
    dense_t = _ratio_table(rows, [512, 1024, 2048])
    dense = plots.log2_heatmap(b, dense_t, annot=dense_t)
    _draw_twice(fig)
    assert roomy.numbers.fontsize >= plots.MIN_FONT_PT
    assert all(t.get_visible() and t.get_fontsize() >= plots.MIN_FONT_PT for t in roomy.numbers.texts)
    boxes = _visible_boxes(roomy.numbers.texts, fig)
    assert not any(p.overlaps(q) for p, q in itertools.combinations(boxes, 2))
    assert dense.numbers.fontsize == 0 and not any(t.get_visible() for t in dense.numbers.texts)
    # the dense axis labels every k-th row so that its labels do not overlap either
    ticks = [t for t in b.get_yticklabels() if t.get_text()]
    assert 2 <= len(ticks) < len(rows)
    assert not any(p.overlaps(q) for p, q in itertools.combinations(_visible_boxes(ticks, fig), 2))


def test_cell_numbers_read_on_dark_and_light_cells():
    fig, ax = plt.subplots(figsize=(5, 3))
    t = pd.DataFrame([[1.0, 8.0]], index=[1], columns=[1, 2])
    hm = plots.log2_heatmap(ax, t, cmap="viridis_r", log_color=True, annot=t)
    light, dark = hm.numbers.texts
    assert light.get_color() == "black" and dark.get_color() == "white"


# --- labels and sizes ------------------------------------------------------------------------------------------

def test_sm_multiple_labels_do_not_overlap():
    # cta_latency's panels: 2 x 3 at the page's width, CTAs from 1 to 16K, 1x..4x the SMs close together on log2
    fig, axes = plt.subplots(2, 3, figsize=plots.figsize(3.9 * 3 + 1.3, 6.4), squeeze=False)
    for ax in axes.flat:
        ax.scatter([1, 16384], [0, 1])
        plots.log2_axis(ax, "x")
        assert plots.mark_sm_multiples(ax, 132) == [1, 2, 3, 4, 8, 16, 32, 64]
    fig2, ax2 = plt.subplots(figsize=(4, 3))  # along y (the waves page), 1x to 32x under a 4K limit
    ax2.set_yscale("log", base=2)
    ax2.set_ylim(0.7, 4400)
    plots.mark_sm_multiples(ax2, 132, axis="y")
    for f, axs in ((fig, list(axes.flat)), (fig2, [ax2])):
        _draw_twice(f)
        for ax in axs:
            boxes = _visible_boxes(ax.texts, f)
            shown = [t.get_text().strip() for t in ax.texts if t.get_visible()]
            assert "SMs=132" in shown and len(shown) >= 3, shown
            assert len(shown) < len(ax.texts)  # the crowded ones left out
            assert not any(p.overlaps(q) for p, q in itertools.combinations(boxes, 2)), shown
            inside = ax.get_window_extent().padded(2)
            assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1
                       for b in boxes)
            assert all(t.get_fontsize() >= plots.MIN_FONT_PT for t in ax.texts)


def test_log2_tick_labels_do_not_overlap_on_a_narrow_axis():
    fig, axes = plt.subplots(1, 4, figsize=plots.figsize(3.3 * 4 + 1.3, 3.5))
    for ax in axes:
        ax.plot([1, 128], [1, 2])
        plots.log2_axis(ax, "x")
    _draw_twice(fig)
    for ax in axes:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 3
        assert not any(p.overlaps(q) for p, q in itertools.combinations(_visible_boxes(labels, fig), 2))


def test_text_is_never_below_the_minimum_at_the_pages_width():
    import matplotlib.font_manager as fm

    assert plots.PAGE_WIDTH_IN * plots.DPI <= 1040  # a page about 1100 px wide shows the figure unscaled
    assert plots.MIN_FONT_PT * plots.DPI / 72 >= 12  # 9 pt: 12 px
    assert matplotlib.rcParams["figure.dpi"] == plots.DPI == matplotlib.rcParams["savefig.dpi"]
    for key in plots.FONT_SIZES:
        assert fm.FontProperties(size=matplotlib.rcParams[key]).get_size_in_points() >= plots.MIN_FONT_PT, key
    assert plots.figsize(14.4, 3) == (plots.PAGE_WIDTH_IN, 3.0) and plots.figsize(7.5, 3) == (7.5, 3.0)
    for f in NOTEBOOKS:  # the notebooks set no smaller font and no figure wider than the page
        text = f.read_text()
        small = [float(x) for x in re.findall(r"fontsize=(\d+(?:\.\d+)?)", text) if float(x) < plots.MIN_FONT_PT]
        assert not small, f.name
        wide = [float(x) for x in re.findall(r"figsize=\((\d+(?:\.\d+)?),", text) if float(x) > plots.PAGE_WIDTH_IN]
        assert not wide, f.name


# --- JupyterLab opens notebooks/*.py as notebooks --------------------------------------------------------------

LAB_CONFIG = ROOT / ".jupyter" / "labconfig" / "default_setting_overrides.json"


def test_lab_setting_and_make_target_are_committed_together():
    setting = json.loads(LAB_CONFIG.read_text())
    assert setting["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["python"] == "Jupytext Notebook"
    make = (ROOT / "Makefile").read_text()
    target = re.search(r"^lab:.*\n\t(.+)$", make, re.M)
    assert target and 'JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter' in target.group(1) and "jupyter lab" in target.group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict | str:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    return json.loads(body) if r.headers.get_content_type() == "application/json" else body


def _lab_server(root: Path, home: Path, *, with_setting: bool):
    """A JupyterLab server on ``root`` as ``make lab`` starts it (or without the setting), isolated from the user's
    own Jupyter configuration; yields its base URL."""
    jupyter = Path(sys.executable).with_name("jupyter")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY"))}
    env.update(JUPYTER_CONFIG_DIR=str(home / "cfg"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "rt"), JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "ws"), HOME=str(home))
    if with_setting:
        env["JUPYTER_CONFIG_PATH"] = str(root / ".jupyter")
    port = _free_port()
    cmd = [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
           "--IdentityProvider.token=t", f"--ServerApp.root_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited: {proc.stderr.read()[-2000:]}")
            try:
                _get(f"{base}/api/status?token=t")
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("jupyter lab did not answer within 20 s")
        return proc, base
    except BaseException:
        proc.terminate()
        proc.wait(timeout=20)
        raise


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


def test_jupyter_lab_opens_the_notebooks_as_notebooks(tmp_path):
    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupytext")
    if not Path(sys.executable).with_name("jupyter").exists():
        pytest.skip("no jupyter command beside this Python")
    # a fresh clone's files that matter: the lab setting and the notebooks
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / ".jupyter", clone / ".jupyter")
    (clone / "notebooks").mkdir()
    for f in NOTEBOOKS:
        shutil.copy(f, clone / "notebooks" / f.name)
    plugin = "/lab/api/settings/@jupyterlab/docmanager-extension:plugin?token=t"

    proc, base = _lab_server(clone, tmp_path / "home", with_setting=True)
    try:
        schema = _get(base + plugin)["schema"]["properties"]["defaultViewers"]
        assert schema["default"].get("python") == "Jupytext Notebook"
        assert "jupyterlab-jupytext" in _get(f"{base}/lab?token=t")  # the viewer's extension is in the page
        url = f"{base}/api/contents/notebooks/waves.py?type=notebook&content=1&token=t"
        nb = _get(url)
        assert nb["type"] == "notebook"
        assert [c["metadata"].get("tags") for c in nb["content"]["cells"]].count(["parameters"]) == 1
        # saving from the notebook view writes the same py:percent text back (jupytext adds its version stamp)
        before = (clone / "notebooks" / "waves.py").read_text()
        body = json.dumps({"type": "notebook", "format": "json", "content": nb["content"]}).encode()
        req = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=20).read()
        stamp = re.compile(r"^#\s+(format_version|jupytext_version): .*\n", re.M)
        assert stamp.sub("", (clone / "notebooks" / "waves.py").read_text()) == before
    finally:
        _stop(proc)

    proc, base = _lab_server(clone, tmp_path / "home2", with_setting=False)  # the control: without the setting
    try:
        schema = _get(base + plugin)["schema"]["properties"]["defaultViewers"]
        assert schema.get("default", {}).get("python") != "Jupytext Notebook"
    finally:
        _stop(proc)
