"""The user guide (docs/): every Marimo notebook runs headless and exports to
HTML without an error cell (`docs/build.py`, what `make docs` runs), the
index links every page, the pages refer to the frontend copied next to them
(no network needed), a notebook that raises fails the build, and one exported
page opened in headless Chromium renders its outputs: its plot as an image and
no error cell."""
from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# seconds one notebook may take to run and export (each is meant to take about a minute on a
# loaded 2-core machine, much less on a quiet one)
NOTEBOOK_TIMEOUT = 300

# found, not imported: a marimo module in this process makes other libraries believe they
# run inside a notebook (transformers' Trainer then imports IPython for its progress bars)
if importlib.util.find_spec("marimo") is None:
    pytest.skip("marimo is not installed: run `make build` (requirements.txt pins it)", allow_module_level=True)


def _load_build():
    spec = importlib.util.spec_from_file_location("docs_build", DOCS / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()
NOTEBOOKS = build.notebooks()


@pytest.fixture(scope="module")
def guide(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The whole guide, built once into a temporary folder."""
    out = tmp_path_factory.mktemp("guide")
    proc = subprocess.run([sys.executable, str(DOCS / "build.py"), "--out", str(out),
                           "--timeout", str(NOTEBOOK_TIMEOUT)],
                          cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=NOTEBOOK_TIMEOUT * len(NOTEBOOKS) + 120)
    return out, proc


def _session(page: Path) -> dict:
    """The run's outputs embedded in an exported page (marimo's session snapshot)."""
    text = page.read_text()
    at = text.find('"session": ')
    assert at >= 0, f"{page.name}: no session snapshot in the exported page"
    session, _ = json.JSONDecoder().raw_decode(text, at + len('"session": '))
    return session


def _cell_errors(session: dict) -> list[str]:
    errors = []
    for cell in session["cells"]:
        for out in cell.get("outputs", []):
            if out.get("type") == "error":
                errors.append(f"cell {cell.get('id')}: {json.dumps(out)[:400]}")
        for line in cell.get("console", []):
            if "traceback" in line.get("mimetype", ""):
                errors.append(f"cell {cell.get('id')} printed a traceback: {line.get('text', '')[:400]}")
    return errors


def test_the_guide_has_its_pages():
    names = [p.stem for p in NOTEBOOKS]
    for topic in ("getting_started", "execution_modes", "device_agnostic", "precision", "examples",
                  "benchmarking", "porting_cuda", "compile", "distributed", "hugging_face"):
        assert any(n.endswith(topic) for n in names), f"no notebook about {topic} in docs/: {names}"
    for nb in NOTEBOOKS:
        title, blurb = build.describe(nb)
        assert title != nb.stem and blurb, f"{nb.name}: no app_title or no opening paragraph"


def test_the_readme_links_every_page():
    readme = (ROOT / "README.md").read_text()
    linked = re.findall(r"\]\((docs/\d\d_[a-z0-9_]+\.py)\)", readme)
    assert linked == [f"docs/{nb.name}" for nb in NOTEBOOKS], "README.md's user guide table, in order"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_exports_without_errors(guide, nb):
    out, proc = guide
    page = out / f"{nb.stem}.html"
    status = re.search(rf"^(ok  |FAIL) {re.escape(nb.name)}\s.*$", proc.stdout, re.M)
    assert status, f"{nb.name} was not built:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert status.group(1) == "ok  ", f"{nb.name} failed:\n{status.group(0)}\n{proc.stderr[-6000:]}"
    assert page.exists()
    session = _session(page)
    assert not _cell_errors(session)
    source = nb.read_text()
    assert len(session["cells"]) == source.count("\n@app.cell"), "every cell of the notebook ran"
    text = page.read_text()
    assert "cdn.jsdelivr.net" not in text, "the page must load the local copy of marimo's frontend"
    for ref in re.findall(r'(?:src|href)="\./([^"]+)"', text):
        assert (out / ref).exists(), f"{page.name} refers to ./{ref}, which the build did not copy"


def test_index_links_every_page(guide):
    out, proc = guide
    assert proc.returncode == 0, proc.stderr[-6000:]
    index = (out / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)\.html">', index)
    assert links == [nb.stem for nb in NOTEBOOKS]
    for nb in NOTEBOOKS:
        assert build.describe(nb)[0] in index.replace("&quot;", '"')


def test_a_failing_notebook_fails_the_build(tmp_path):
    nb = tmp_path / "99_broken.py"
    nb.write_text(
        "import marimo\n\napp = marimo.App()\n\n\n"
        "@app.cell\ndef _():\n    x = 1\n    return (x,)\n\n\n"
        "@app.cell\ndef _(x):\n    raise ValueError(f'broken on purpose {x}')\n    return\n\n\n"
        "if __name__ == '__main__':\n    app.run()\n")
    ok, _secs, log = build.export(nb, tmp_path, timeout=NOTEBOOK_TIMEOUT)
    assert not ok
    assert "some cells failed" in log
    errors = _cell_errors(_session(tmp_path / "99_broken.html"))
    assert errors and any("broken on purpose" in e for e in errors)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def test_exported_page_renders_in_chromium(guide, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs the Debian package `chromium`; "
                    "`apt-get install chromium` failed or was not run)")
    out, _ = guide
    page = "01_getting_started.html"
    assert (out / page).exists()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000",
                               "--dump-dom", url],
                              capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        server.shutdown()
        server.server_close()
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rendered by the frontend, not just present in the embedded JSON: real elements
    assert '<h1 id="getting-started' in dom, "the page's first heading was not rendered"
    outputs = re.findall(r'data-cell-role="output"', dom)
    assert len(outputs) >= len(_session(out / page)["cells"]), "every cell's output area was rendered"
    images = re.findall(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]{1000,})"', dom)
    assert images, "the memory plot was not rendered as an image"
    assert 'role="alert"' not in dom, "an error cell was rendered"
    assert "This cell wasn't run because it has errors" not in dom
