"""``splitlab report``: execute the notebooks on a result set, headlessly, into HTML.

    from splitlab import report
    report.build_report("h200", Path("reports"))        # a catalog name or a folder -> reports/index.html

For each notebook in ``notebooks/`` (jupytext ``py:percent`` sources, each with a tagged ``parameters`` cell)
the driver converts the source to ``.ipynb`` in a temporary folder (never beside the sources), executes it with
papermill (kernel ``python3``, cwd the repository root, the parameters of ``notebook_parameters``: ``data``,
``allow_fake``, the confirm sets, and ``out`` for the ``sweep`` notebook), writes ``<out>/<name>.ipynb``
(executed) and ``<out>/<name>.html`` (nbconvert, code cells left out, figures embedded as PNG), and finally
``<out>/index.html``: a link to each page with its one-line finding, the data's device(s) and date, and a MODELLED
banner when the rows come from the fake timer.

Findings and figures' numbers: each page records them in its outputs' metadata (``splitlab.notebook``:
``record_finding``, ``show_figure``), and the driver reads them back from the executed notebook (``read_finding``,
``figure_tables``) for the index and the CSV files beside the page.

Which sets: the catalog's (``splitlab.catalog``, ``data/catalog.toml``): by default its current set and the confirm
sets of that set's device; each notebook's ``parameters`` cell holds the same defaults (``tests/test_notebooks.py``
checks that they agree), so a notebook opened in JupyterLab computes what the report shows.

The notebooks read their data with ``splitlab.datasets`` (``load_data``: the rows and a ``DataInfo``, the
provenance the index shows too) and show it with ``splitlab.notebook``'s helpers; this module is the driver only.

Wiring into the CLI (``splitlab/cli.py``)::

    r = sub.add_parser("report", help="execute the notebooks on a result set into HTML")
    report.add_arguments(r)
    r.set_defaults(fn=report.cli)
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitlab import catalog
from splitlab.args import OneLineParser, out_dir, path_text, run_main
from splitlab.datasets import MODELLED, DataInfo, data_info, resolve_data
from splitlab.errors import SplitlabError
from splitlab.notebook import figure_tables, read_finding
from splitlab.report_parameters import declared_parameters, notebook_arguments, parameter_text
from splitlab.resources import notebooks_dir

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = notebooks_dir()  # the repository's notebooks/, or their copy in an installed package
#: The notebooks, in report order.
NOTEBOOKS = ("waves", "cta_latency", "split_regressions", "planner_shootout", "seeds", "kernels", "schedules",
             "timelines", "sweep")
#: The index's answer (``splitlab.headline``) as a page ``--only`` can name: a report of some pages (``--only waves``)
#: builds it only when named (``--only waves,headline``; ``--only headline``: the index alone), a whole report always.
HEADLINE = "headline"
#: What ``--only`` takes.
PAGES = (*NOTEBOOKS, HEADLINE)


# --- running the notebooks --------------------------------------------------------------------------------

@dataclass
class Page:
    """One executed notebook of the report."""

    name: str
    title: str
    status: str = "ok"  # ok | the error
    finding: str = ""
    seconds: float = 0.0
    facts: dict = field(default_factory=dict)
    figures: list = field(default_factory=list)  # the CSV files of its figures' numbers (``show_figure``)


def _title(nb: Any, name: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return name


@contextlib.contextmanager
def _kernel_env(tmp: Path) -> Iterator[None]:
    """The environment the kernels run in: Jupyter, IPython and matplotlib write into ``tmp`` (not the home
    folder) unless told otherwise; no ``MPLBACKEND`` (it would replace the inline backend and the figures
    would vanish); the repository on ``PYTHONPATH``."""
    saved = dict(os.environ)
    try:
        for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "mpl")):
            if not os.environ.get(var):
                (tmp / sub).mkdir(parents=True, exist_ok=True)
                os.environ[var] = str(tmp / sub)
                # A local kernel: its warning about TCP without encryption is noise here, and so are its errors
                # when an interrupt (Ctrl-C to the process group) ends it mid-reply.
                if var == "IPYTHONDIR":
                    (tmp / sub / "profile_default").mkdir()
                    (tmp / sub / "profile_default" / "ipython_kernel_config.py").write_text(
                        'c.IPKernelApp.log_level = "CRITICAL"\n')
        os.environ.pop("MPLBACKEND", None)
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), saved.get("PYTHONPATH")) if x)
        os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _select(only: Sequence[str] | None) -> list[str]:
    """The pages ``only`` names (``PAGES``: the notebooks and the ``headline``), in report order; all of them for
    None."""
    if only is None:
        return list(PAGES)
    if isinstance(only, str):
        only = [only]
    names = [n.strip() for item in only for n in str(item).split(",") if n.strip()]
    if not names:
        raise SplitlabError(f"only={list(only)!r} is not allowed; expected page names among "
                            f"{', '.join(PAGES)} (or no --only: all of them)")
    for n in names:
        if n not in PAGES:
            raise SplitlabError(f"only={n!r} is not allowed; expected any of {', '.join(PAGES)}")
    return [n for n in PAGES if n in names]


#: What executing the notebooks imports: the ``lab`` extra's modules (``pyproject.toml``), and how to install them.
LAB_MODULES = ("jupytext", "nbformat", "papermill", "nbconvert", "ipykernel", "yaml")
LAB_EXTRA = "pip install 'splitlab[lab]'"


def check_lab() -> None:
    """Refuse, in one ``SplitlabError`` naming the extra, to run notebooks where the ``lab`` extra is not installed
    (``splitlab`` alone plans, sweeps and fits; its report executes notebooks). Looks the modules up without
    importing them."""
    import importlib.util

    missing = []
    for m in LAB_MODULES:
        try:
            if importlib.util.find_spec(m) is None:
                missing.append(m)
        except (ImportError, ValueError):
            missing.append(m)
    if missing:
        raise SplitlabError(f"the report's notebooks need the lab extra ({', '.join(missing)} not installed); "
                            f"expected {LAB_EXTRA} (or --only {HEADLINE}: the index's answer alone needs none)")


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(f"splitlab report: {msg}", file=sys.stderr, flush=True)


# JupyterLab's template without the scripts it loads from a CDN (require.js, MathJax, Mermaid): the pages use
# none of them, and a report must open offline. Figures are embedded PNG and the CSS is inlined.
_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block data_png scoped %}
{%- set fig = (output.metadata.get('splitlab') or {}).get('figure') -%}
{%- if fig and resources.splitlab_page -%}
{%- set csv = resources.splitlab_page ~ '-' ~ fig ~ '.csv' -%}
{{ super() | replace('</div>', '<div class="splitlab-csv" style="font:12px sans-serif;margin:2px 0 12px">The numbers '
   ~ 'of this figure: <a href="' ~ csv ~ '">' ~ csv ~ '</a></div></div>') }}
{%- else -%}
{{ super() }}
{%- endif %}
{% endblock data_png %}
"""


def to_html(nb: Any, title: str, name: str = "") -> str:
    """Self-contained HTML of an executed notebook without its code cells (``nbconvert --no-input``): figures
    embedded, CSS inlined, no script from the network; with a link back to the index and, under each figure that
    ``show_figure`` showed, a link to its numbers (``<name>-<figure>.csv``, written by ``build_report``)."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", template_file="splitlab_report.html.j2",
                            extra_loaders=[jinja2.DictLoader({"splitlab_report.html.j2": _TEMPLATE})],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}, "splitlab_page": name})
    back = ('<div style="font:13px sans-serif;margin:8px 16px"><a href="index.html">&larr; splitlab report '
            'index</a></div>')
    i = body.find(">", body.find("<body"))
    return body[: i + 1] + back + body[i + 1:] if i > 0 else back + body


def notebook_parameters(data: str | Path | None = None, *, allow_fake: bool = False,
                        out: str | Path = "reports") -> dict[str, Any]:
    """The parameters ``build_report`` passes every notebook (each takes those its ``parameters`` cell declares):
    ``data`` (a catalog name as given, else the resolved path; the catalog's current set when empty),
    ``allow_fake``, ``confirm`` (the names of the catalog's confirm sets of that set's device when ``data`` is a
    current set, by name or by path, else none: confirm sweeps belong to the data they confirm), ``peers`` (the
    catalog's peers sets of the device whenever ``data`` is catalog data, by name or by path, whatever its role:
    the comparison, then those of its repeats that are here, ``catalog.peers_of``; none for data outside the
    catalog) and ``out`` (``<out>/sweep-runs``, where the ``sweep`` notebook sweeps)."""
    if not data:
        data = catalog.current().name
    data = str(data) if catalog.is_name(data) else str(resolve_data(data))
    entry = catalog.set_at(data)
    current = entry is not None and "current" in entry.roles
    confirm = [e.name for e in catalog.confirm_for(entry)] if current else []
    # (a wheel carries the comparison, not its repeats: splitlab.resources)
    peers = [e.name for e in catalog.peers_of(data) or [] if all(s.is_dir() for s in e.sources())]
    return dict(data=data, allow_fake=bool(allow_fake), confirm=confirm, peers=peers,
                out=str(Path(out).resolve() / "sweep-runs"))


def build_report(data: str | Path | None, out: Path, only: list[str] | None = None, progress: bool = True, *,
                 allow_fake: bool = False, notebooks: Path | None = None, cell_timeout: int | None = None,
                 parameters: Mapping[str, Mapping[str, Any]] | None = None,
                 parameter_texts: Mapping[str, str] | None = None) -> Path:
    """Execute the notebooks (``only`` those named, of ``PAGES``) on ``data`` (a catalog name or a folder; None: the
    catalog's current set) into ``out``; return ``out/index.html``. The index's answer (``splitlab.headline``) is
    computed only where shown: in a whole report, or where ``only`` names ``headline`` (``only=["headline"]``: the
    index alone, no notebook, no ``lab`` extra needed); notebooks without the ``lab`` extra are one
    ``SplitlabError`` naming it (``check_lab``).

    Each notebook gets the ``notebook_parameters`` it declares (``data``, ``allow_fake``; the confirm sets for
    ``planner_shootout`` when ``data`` is the current set; ``out=<out>/sweep-runs`` for ``sweep``), plus each of
    ``parameter_texts`` (``splitlab report -p NAME=VALUE``: to every notebook that declares NAME, VALUE read as YAML)
    and ``parameters[name]`` when given (e.g. ``{"sweep": {"card": "gqa_decode"}}``): ``report_parameters``.

    Writes ``out/<name>.ipynb`` (executed) and ``out/<name>.html`` per notebook and ``out/index.html``: into a
    staging folder first, moved into ``out`` (the index last) once every notebook has run, so an interrupted report
    (Ctrl-C, SIGTERM) leaves the previous one whole; its temporary and staging folders go on every way out, and
    those of a report killed outright go on the next run (``remove_stale``). A missing or foreign ``data``, an
    ``out`` that is a file or cannot be written, or an empty ``only`` raises ``SplitlabError`` naming it before
    anything runs; so does data from the fake timer unless ``allow_fake``. A notebook whose kernel dies (killed,
    out of memory) is run once more (``KERNEL_DEATH_RETRIES``). A notebook that fails still gets its page (with
    the error) and its line in the index; ``SplitlabError`` names the failures after all have run."""
    selected = _select(only)
    names = [n for n in selected if n in NOTEBOOKS]
    if names:
        check_lab()
    info = data_info(data or catalog.current().name)
    injected = notebook_parameters(data, allow_fake=allow_fake, out=out)
    if info.fake and not allow_fake:
        raise SplitlabError(f"data={str(info.path)!r} holds modelled rows (timer='fake'), not measurements; pass "
                            "--allow-fake (allow_fake=True) to report them anyway, labelled MODELLED")
    for name in parameters or {}:
        if name not in NOTEBOOKS:
            raise SplitlabError(f"parameters[{name!r}] is not allowed; expected notebooks among {', '.join(NOTEBOOKS)}")
    src_dir = Path(notebooks) if notebooks is not None else NOTEBOOK_DIR
    declared = declared_parameters(names, src_dir) if names else {}  # each parameters cell, inspected once
    given = notebook_arguments(names, src_dir, parameter_texts, parameters, declared=declared)  # checked up front
    out = out_dir("out", out).resolve()
    remove_stale(out)
    if names:  # (after every check: a refused argument never waits for these; the index alone needs none)
        import jupytext
        import nbformat
        import papermill

    pages: list[Page] = []
    what = f"{len(names)} notebook(s)" + (" and the answer" if HEADLINE in selected else "")
    _say(f"{what} on {info.path} ({info.label}) -> {out}", progress)
    # Pages are written into a staging folder inside ``out`` and moved into place (index last) only when every
    # notebook has run: an interrupted report leaves the previous report whole. The staging and temporary
    # folders carry the pid, so a run killed outright has its leftovers removed by the next (remove_stale).
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as tmp_, _kernel_env(Path(tmp_)), \
            _staging(out) as stage, _own_children(), _quiet_logger("papermill"):
        tmp = Path(tmp_)
        for i, name in enumerate(names, 1):
            nb = jupytext.read(src_dir / f"{name}.py")
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            page = Page(name, _title(nb, name))
            nb.metadata["title"] = page.title
            inp = tmp / f"{name}.ipynb"
            nbformat.write(nb, inp)
            params = {k: v for k, v in injected.items() if k in declared[name]}
            params.update(given.get(name, {}))  # notebook_arguments checked them against the declared names
            executed = stage / f"{name}.ipynb"
            _say(f"[{i}/{len(names)}] {name}: executing", progress and sys.stderr.isatty())  # a log: one line each
            t0 = time.monotonic()
            for attempt in range(1 + KERNEL_DEATH_RETRIES):
                try:
                    # Per-cell progress bars only on a terminal: in a log (CI) each is a line of carriage returns.
                    papermill.execute_notebook(str(inp), str(executed), parameters=params, kernel_name="python3",
                                               progress_bar=progress and sys.stderr.isatty(), cwd=str(ROOT),
                                               execution_timeout=cell_timeout, log_output=False)
                    page.status = "ok"
                except papermill.PapermillExecutionError as e:
                    page.status = f"{e.ename}: {e.evalue}"
                except Exception as e:  # the kernel died, timed out, or would not start
                    page.status = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                    if _kernel_died(e):  # out of memory, killed: maybe not the notebook's doing, so once more
                        if attempt < KERNEL_DEATH_RETRIES:
                            _say(f"[{i}/{len(names)}] {name}: {page.status}; running it once more", progress)
                            continue
                        page.status += f" ({attempt + 1} times)"
                break
            page.seconds = time.monotonic() - t0
            done = nbformat.read(executed, as_version=4) if executed.is_file() else nb
            found = read_finding(done) or {}
            page.finding = str(found.pop("finding", ""))
            page.facts = found
            page.figures = _write_figure_tables(done, name, stage, page)
            (stage / f"{name}.html").write_text(to_html(done, page.title, name), encoding="utf-8")
            _say(f"[{i}/{len(names)}] {name}: {page.status} in {page.seconds:.1f} s -> {name}.html", progress)
            pages.append(page)
        if HEADLINE in selected:
            head, head_note = _headline(_headline_sets(injected, given), allow_fake, stage, progress)
        else:  # not shown, so not computed (seconds to a minute): the pages asked for come back alone
            head, head_note = None, (f"Not built by this report (--only {','.join(selected)}): `splitlab report` "
                                     f"builds it with every page, `--only {HEADLINE}` alone.")
        (stage / "index.html").write_text(index_html(pages, info, head, head_note), encoding="utf-8")
        for f in sorted(stage.iterdir(), key=lambda f: f.name == "index.html"):  # the index last
            os.replace(f, out / f.name)
    index = out / "index.html"
    _say(f"index: {index}", progress)
    failed = [p for p in pages if p.status != "ok"]
    if failed:
        raise SplitlabError("notebook(s) failed: " + "; ".join(f"{p.name}: {p.status}" for p in failed)
                            + f" (see {out}/<name>.html; the index is {index})")
    if head is None and head_note.startswith(HEADLINE_FAILED):
        raise SplitlabError(f"{head_note} (the index is {index})")
    return index


#: How often a notebook whose kernel died (``DeadKernelError``: killed, out of memory) is run again before its page
#: is given up (failed, named at the end; the other pages are built and the report exits non-zero).
KERNEL_DEATH_RETRIES = 1


def _kernel_died(e: BaseException) -> bool:
    """Whether ``e`` says the notebook's kernel died (nbclient's ``DeadKernelError``)."""
    try:
        from nbclient.exceptions import DeadKernelError
    except ImportError:  # pragma: no cover - papermill brings nbclient
        return type(e).__name__ == "DeadKernelError"
    return isinstance(e, DeadKernelError)


def _write_figure_tables(nb: Any, name: str, folder: Path, page: Page) -> list[str]:
    """Write the numbers of each figure of an executed notebook (``show_figure``) as ``<name>-<figure>.csv`` into
    ``folder``; return the file names. A figure name shown twice fails the page (the second would overwrite the
    first's numbers)."""
    written: list[str] = []
    for fig, csv in figure_tables(nb):
        fname = f"{name}-{fig}.csv"
        if fname in written:
            if page.status == "ok":
                page.status = f"figure name {fig!r} shown twice (each figure of a notebook needs its own name)"
            continue
        (folder / fname).write_text(csv, encoding="utf-8")
        written.append(fname)
    return written


HEADLINE_FAILED = "the headline failed"


def _headline_sets(injected: Mapping[str, Any], given: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The sets the headline scores: the report's (``notebook_parameters``), with the confirm sets the
    ``planner_shootout`` page was given and the peers sets the ``kernels`` page was given (``-p``, ``parameters``), so
    that the index states what those pages show."""
    return dict(injected, confirm=given.get("planner_shootout", {}).get("confirm", injected.get("confirm")),
                peers=given.get("kernels", {}).get("peers", injected.get("peers")))


def _headline(params: Mapping[str, Any], allow_fake: bool, folder: Path, progress: bool) -> tuple[Any, str]:
    """The front page's headline (``splitlab.headline``) of the report's sets (``notebook_parameters``: the data,
    its confirm and peers sets), its tables written into ``folder`` (``headline.csv``, ``index-summary.csv``: the
    figure's numbers); or None and a note: why these data have none (a ``SplitlabError``), or, for any other error,
    ``HEADLINE_FAILED`` and the error (``build_report`` then fails after writing the report)."""
    from splitlab import headline

    try:
        head = headline.build(params["data"], params.get("confirm") or (), params.get("peers") or (),
                              allow_fake=allow_fake)
    except SplitlabError as e:
        _say(f"headline: none ({e})", progress)
        return None, f"No headline for these data: {e}"
    except Exception as e:  # a bug: shown on the index, and the report fails once written
        _say(f"headline: failed ({type(e).__name__}: {e})", progress)
        return None, f"{HEADLINE_FAILED}: {type(e).__name__}: {e}"
    head.table().to_csv(folder / HEADLINE_CSV, index=False)
    headline.summary_table(head).to_csv(folder / SUMMARY_CSV, index=False)
    return head, ""


#: The index's tables as CSV: the headline's numbers, and those of its figure.
HEADLINE_CSV, SUMMARY_CSV = "headline.csv", "index-summary.csv"


def _children() -> dict[int, Any]:
    try:
        import psutil  # ipykernel's dependency: there whenever a report can run
    except ImportError:
        return {}
    try:
        return {c.pid: c for c in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


@contextlib.contextmanager
def _own_children() -> Iterator[None]:
    """On an exception (Ctrl-C, SIGTERM), stop the processes started inside the block (the notebook's kernel) before
    the temporary folders go: a KeyboardInterrupt inside papermill's event loop skips its kernel shutdown, and an
    orphaned kernel would write into them again."""
    before = set(_children())
    try:
        yield
    except BaseException:
        new = [proc for pid, proc in _children().items() if pid not in before]
        if new:
            import psutil

            for proc in new:
                with contextlib.suppress(psutil.Error):
                    proc.terminate()
            _, alive = psutil.wait_procs(new, timeout=3)
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        raise


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Papermill logs a dying kernel on stderr ("Kernel died while waiting for execute reply"); the page's status
    says it already (and after Ctrl-C it is a consequence, not news)."""
    import logging

    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


TMP_PREFIX = "splitlab-report-"
STAGING_PREFIX = ".splitlab-report-staging-"


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A staging folder inside ``out`` (``.splitlab-report-staging-<pid>-...``), removed on every way out."""
    stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=out))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def remove_stale(out: Path | None = None) -> list[Path]:
    """Remove the temporary folders (``<tmp>/splitlab-report-<pid>-*``) and, in ``out``, the staging folders of
    reports whose process is gone (killed with SIGKILL, where no cleanup runs); return what was removed. Folders
    of live processes, of other users, and without a pid in their name are left alone."""
    from splitlab.results import pid_alive

    places = [(Path(tempfile.gettempdir()), TMP_PREFIX)] + ([(Path(out), STAGING_PREFIX)] if out is not None else [])
    removed = []
    for base, prefix in places:
        try:
            found = list(base.glob(f"{prefix}*"))
        except OSError:
            continue
        for d in found:
            pid = d.name[len(prefix):].split("-", 1)[0]
            try:
                mine = d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid()
            except OSError:
                continue
            if mine and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


def index_html(pages: Sequence[Page], info: DataInfo, head: Any = None, head_note: str = "") -> str:
    """The report's front page: data provenance; the answer first (``head``, a ``splitlab.headline.Headline``: its
    table and figure, embedded as PNG, with links to their CSV; else ``head_note`` says why there is none); then one
    line per notebook with its finding; the sweeps folded."""
    from splitlab import __version__
    from splitlab.bench.env import git_commit

    e = html.escape
    git = git_commit()
    commit = (git.get("commit") or "")[:12] + (" (dirty)" if git.get("dirty") else "")
    banner = (f'<p class="modelled">{e(MODELLED)}: the rows come from the sweep harness\'s fake timer; every number '
              "in this report is a model's output.</p>") if info.fake else ""
    rows = []
    skipped = []
    for p in pages:
        if p.status == "ok" and p.facts.get("skipped"):  # a page that holds no run (sweep without a GPU): one line
            skipped.append(f'<p class="muted">{e(p.title)} ({e(p.name)}): {e(str(p.facts["skipped"]))}.</p>')
            continue
        status = "" if p.status == "ok" else f'<div class="err">failed: {e(p.status)}</div>'
        finding = e(p.finding) if p.finding else '<span class="muted">(no finding recorded)</span>'
        csvs = "".join(f' · <a href="{e(f)}">{e(f.removeprefix(p.name + "-"))}</a>' for f in p.figures)
        rows.append(f'<tr><td><a href="{e(p.name)}.html">{e(p.title)}</a><div class="muted">{e(p.name)} · '
                    f'<a href="{e(p.name)}.ipynb">.ipynb</a> · {p.seconds:.0f} s</div>'
                    + (f'<div class="muted">figures\' numbers (CSV){csvs}</div>' if csvs else "")
                    + f"</td><td>{finding}{status}</td></tr>")
    sweeps = "".join(f"<tr><td>{e(s['folder'])}</td><td>{e(str(s['kernel']))}</td><td>{e(str(s['grid']))}</td>"
                     f"<td>{e(str(s['timer']))}</td><td>{e(str(s['rows']))}</td><td>{e(str(s['gpu']))}</td>"
                     f"<td>{e(s['date'])}</td></tr>" for s in info.sweeps)
    generated = time.strftime("%Y-%m-%d %H:%M %Z")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>splitlab report: {e(info.device)}, {e(info.date)}</title>
<style>
body {{ font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1080px;
       padding: 0 16px; color: #222; }}
table {{ border-collapse: collapse; width: 100%; margin: 8px 0 20px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 6px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f4f4f4; }}
table.headline td, table.headline th {{ text-align: right; white-space: nowrap; }}
table.headline td:first-child, table.headline th:first-child {{ text-align: left; }}
table.headline th {{ font-weight: 600; white-space: normal; vertical-align: bottom; }}
figure {{ margin: 8px 0 20px; }}
figure img {{ max-width: 100%; }}
.muted {{ color: #666; font-size: 12px; font-weight: normal; }}
.err {{ color: #b00000; font-size: 12px; margin-top: 4px; }}
.modelled {{ background: #fde8e8; color: #b00000; border: 1px solid #b00000; padding: 8px 12px; font-weight: 600; }}
summary {{ cursor: pointer; }}
</style></head><body>
<h1>splitlab report</h1>
<p><b>Device:</b> {e(info.device)} ({e(info.sms)}) · <b>data:</b> {e(info.date)} ·
<code>{e(info.where)}</code></p>
{banner}
{_headline_html(head, head_note, info)}
<h2>Pages</h2>
<table><tr><th style="width:30%">notebook</th><th>finding</th></tr>
{''.join(rows)}
</table>
{''.join(skipped)}
<details><summary>The {len(info.sweeps)} sweep(s) behind these pages</summary>
<table><tr><th>folder</th><th>kernel</th><th>grid</th><th>timer</th><th>rows</th><th>GPU</th><th>date</th></tr>
{sweeps}</table></details>
<p class="muted">Generated {e(generated)} by splitlab {e(__version__)} {e(commit)} (<code>splitlab report</code>).</p>
</body></html>
"""


def _headline_html(head: Any, note: str, info: DataInfo) -> str:
    """The index's answer: the headline table, what its numbers are, and its figure (or why there is none)."""
    import base64

    from splitlab import headline

    e = html.escape
    if head is None:
        cls = "err" if note.startswith(HEADLINE_FAILED) else "muted"
        return f'<h2>The answer</h2><p class="{cls}">{e(note or "No headline.")}</p>'
    confirm = [s for s in head.sets if s != headline.HELD_OUT]
    sets = (f"<i>held-out</i>: the shapes of <code>{e(head.data)}</code> the fit never saw"
            + (f"; <i>confirm</i>: {', '.join(f'<code>{e(c)}</code>' for c in confirm)}, fresh shapes swept after "
               "the rule was final" if confirm else ""))
    png = base64.b64encode(headline.figure_png(head, info)).decode()
    peers = f"<code>{e(head.peers_set)}</code>" if head.peers_set else "the peers set"
    if head.peers_note:
        peers += f" ({e(head.peers_note)})"
    return f"""<h2>The answer</h2>
<p>Per family: how far splitlab's split planner is from the best measured split, beside the best ported rule, and
how close splitlab's kernels come to the device's roofline beside the fastest peer library.</p>
{headline.html(head)}
<p class="muted">Regret: the p50 of the split (and tile) a planner picks over the best p50 measured for that shape, on
splitlab's kernels; geomean / worst over the shapes ({sets}). Bold: the goal met (geomean &le; 1.02, worst &le; 1.10,
below every ported rule). Roofline fraction: the device's floor (unique bytes / read ceiling, or FLOPs / matrix
ceiling) over the measured p50, geomean over the shapes of {peers} with a peer measured;
splitlab at its planner's default against the fastest peer of each shape (FlashInfer, FlashMLA, PyTorch SDPA).
Numbers: <a href="{HEADLINE_CSV}">{HEADLINE_CSV}</a>.</p>
<figure><img alt="geomean and worst regret of each planner per family and set" src="data:image/png;base64,{png}">
<figcaption class="muted">The figure's numbers (every planner, shapes, geomean, p90, worst):
<a href="{SUMMARY_CSV}">{SUMMARY_CSV}</a>. More in the planner shootout page.</figcaption></figure>"""


# --- the command line ---------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``splitlab report`` flags."""
    p.add_argument("--data", help="result set: a catalog name (data/catalog.toml) or a folder of sweeps (default: "
                   "the catalog's current set, the newest kernel version of every family)")
    p.add_argument("--out", default="reports", help="folder for the executed notebooks and HTML (default reports/)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only these pages (repeat or comma-separate): {', '.join(PAGES)}; the index's answer "
                   f"is computed only where {HEADLINE} is named (--only {HEADLINE}: the index alone, in seconds)")
    p.add_argument("--allow-fake", action="store_true",
                   help="report modelled rows (timer=fake) too; every figure then says MODELLED")
    p.add_argument("-p", "--parameter", action="append", type=parameter_text, metavar="NAME=VALUE",
                   help="a notebook parameter, to every selected notebook that takes NAME; VALUE is YAML (lists and "
                   "numbers typed: -p devices='[b200, mi300x]'); repeatable")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def cli(args: argparse.Namespace) -> int:
    """Run ``splitlab report`` from parsed arguments (``add_arguments``); prints the index path."""
    data = (None if args.data is None
            else path_text("--data", args.data, "a catalog name or a folder of splitlab sweeps"))
    out_dir("--out", args.out, create=False)  # named as the flag here; build_report creates it
    index = build_report(data, Path(args.out), only=getattr(args, "only", None),
                         progress=not getattr(args, "quiet", False), allow_fake=getattr(args, "allow_fake", False),
                         parameter_texts=dict(getattr(args, "parameter", None) or []))
    print(index)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m splitlab.report [--data DIR] [--out DIR] [--only NAME]`` (the same as ``splitlab report``): a bad
    argument is one line on stderr and exit 2; Ctrl-C or SIGTERM one line and 130, temporary folders removed."""
    p = OneLineParser(prog="splitlab report", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_main("splitlab", lambda: cli(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
