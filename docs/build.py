"""Builds the user guide: runs every notebook in docs/ (NN_name.py, Marimo) and
exports it to static HTML with ``marimo export html``, then writes an
index.html linking the pages.

    python docs/build.py                    # all notebooks -> docs/_build/
    python docs/build.py 02_execution_modes # only the named ones
    python docs/build.py --out /tmp/guide --timeout 300
    python docs/build.py --serve [PORT]     # serve docs/_build on http://127.0.0.1:PORT/ (default 8000)

``marimo export html`` writes pages that load Marimo's frontend (JavaScript,
CSS, fonts) from a CDN. So that the guide opens without network access, the
frontend shipped inside the installed marimo package is copied next to the
pages and the pages refer to that copy. Its scripts are ES modules, which
browsers do not load from file:// URLs: open the pages through a local HTTP
server (``--serve``).

A notebook whose cells raise makes ``marimo export`` exit non-zero; the build
then fails, naming the notebook, and the page is still written for reading.
"""
from __future__ import annotations

import argparse
import datetime
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
DEFAULT_OUT = DOCS / "_build"
NOTEBOOK = re.compile(r"^\d\d_[a-z0-9_]+\.py$")


def notebooks(names: list[str] | None = None) -> list[Path]:
    """The guide's notebooks in order (docs/NN_*.py), or the named ones."""
    found = sorted(p for p in DOCS.iterdir() if NOTEBOOK.match(p.name))
    if not names:
        return found
    by_name = {p.stem: p for p in found}
    missing = [n for n in names if Path(n).stem not in by_name]
    if missing:
        raise SystemExit(f"no such notebook in {DOCS}: {', '.join(missing)} (have: {', '.join(by_name)})")
    return [by_name[Path(n).stem] for n in names]


def describe(path: Path) -> tuple[str, str]:
    """(title, first paragraph) of a notebook: its app_title and the
    paragraph after the first Markdown heading."""
    src = path.read_text()
    m = re.search(r'app_title="([^"]+)"', src)
    title = m.group(1) if m else path.stem
    lines = src.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("# ")), None)
    para: list[str] = []
    if start is not None:
        for ln in lines[start + 1:]:
            s = ln.strip()
            if not s and para:
                break
            if s.startswith('"""'):
                break
            if s:
                para.append(s)
    text = " ".join(para)
    if "." in text and not text.endswith("."):  # the paragraph runs into a table: keep its whole sentences
        text = text[:text.rindex(".") + 1]
    return title, text


def inline_markdown(text: str) -> str:
    """HTML of a line of Markdown with `code` and *emphasis* (escaped)."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*([^*\s][^*]*)\*", r"<em>\1</em>", out)


def marimo_static() -> Path:
    import marimo

    static = Path(marimo.__file__).resolve().parent / "_static"
    if not (static / "assets").is_dir():
        raise SystemExit(f"marimo {marimo.__version__} has no bundled frontend at {static}")
    return static


def copy_frontend(out: Path) -> str:
    """Copies marimo's bundled frontend into out/ (once per marimo version);
    returns the CDN prefix the exported pages use for it."""
    import marimo

    stamp = out / ".marimo-frontend"
    if not stamp.exists() or stamp.read_text() != marimo.__version__:
        static = marimo_static()
        for item in static.iterdir():
            # the frontend: scripts, styles and fonts (assets/), icons, manifests
            if item.name == "index.html" or item.suffix == ".md":
                continue
            dest = out / item.name
            if item.is_dir():
                shutil.copytree(item, dest, dirs_exist_ok=True)
            else:
                shutil.copy2(item, dest)
        stamp.write_text(marimo.__version__)
    version = str(marimo.__version__).replace(".dev", "-dev")
    return f"https://cdn.jsdelivr.net/npm/@marimo-team/frontend@{version}/dist/"


def localize(page: Path, cdn: str) -> None:
    """Points a page's frontend references at the local copy."""
    text = page.read_text()
    if cdn not in text:
        raise RuntimeError(f"{page}: expected marimo's frontend at {cdn}; the export format changed")
    page.write_text(text.replace(cdn, "./"))


def export(nb: Path, out: Path, timeout: float) -> tuple[bool, float, str]:
    """Runs and exports one notebook; (ok, seconds, marimo's output)."""
    env = {**os.environ, "MARIMO_SKIP_UPDATE_CHECK": "1", "MPLBACKEND": "Agg"}
    page = out / f"{nb.stem}.html"
    cmd = [sys.executable, "-m", "marimo", "export", "html", str(nb), "-o", str(page), "--force"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=DOCS.parent,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return False, time.perf_counter() - t0, f"timed out after {timeout:.0f} s\n{e.stderr or ''}"
    secs = time.perf_counter() - t0
    log = (proc.stdout + proc.stderr).strip()
    if not page.exists():
        return False, secs, log or f"marimo exited with {proc.returncode} and wrote no page"
    return proc.returncode == 0, secs, log


def write_index(out: Path, built_now: dict[str, tuple[bool, float]]) -> Path:
    """index.html linking every notebook that has a page in out (built_now:
    name -> (ok, seconds) of this build's pages)."""
    import marimo
    import torch_tpu

    items = []
    for nb in notebooks():
        if not (out / f"{nb.stem}.html").exists():
            continue
        title, blurb = describe(nb)
        ok, secs = built_now.get(nb.stem, (True, None))
        state = "" if ok else ' <strong class="err">(cells failed: see the page)</strong>'
        meta = nb.name + (f", built in {secs:.0f} s" if secs is not None else "")
        items.append(f'<li><a href="{nb.stem}.html">{html.escape(title)}</a>{state}'
                     f'<p>{inline_markdown(blurb)}</p><p class="meta">{meta}</p></li>')
    built = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    index = out / "index.html"
    index.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>torch_tpu user guide</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.45; }}
li {{ margin-bottom: 1rem; }} li a {{ font-size: 1.15rem; font-weight: 600; }} li p {{ margin: 0.2rem 0; }}
.meta {{ color: #666; font-size: 0.85rem; }} .err {{ color: #b00; }}
code {{ background: #f3f3f3; padding: 0 0.2rem; }}
</style></head><body>
<h1>torch_tpu user guide</h1>
<p>Interactive Marimo notebooks, run on this machine when the guide was built and exported as static pages.
Each page is a plain Python file in <code>docs/</code>: open it live with
<code>marimo edit docs/NAME.py</code> (or <code>marimo run</code>), or rebuild the guide with <code>make docs</code>.</p>
<ol>
{chr(10).join(items)}
</ol>
<p class="meta">Built {built} with torch_tpu {html.escape(torch_tpu.__version__)} and marimo
{html.escape(marimo.__version__)}. The pages load Marimo's frontend from this folder, as JavaScript modules:
open them through a local server (<code>python docs/build.py --serve</code>), not as file:// URLs.</p>
</body></html>
""")
    return index


def serve(out: Path, port: int) -> None:
    if not (out / "index.html").exists():
        raise SystemExit(f"{out} has no index.html: build the guide first (make docs)")
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(out), **kw)  # noqa: E731
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving {out} at http://127.0.0.1:{port}/ (Ctrl-C stops)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="notebooks to build (default: all)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default docs/_build)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one notebook may take (default 600)")
    p.add_argument("--serve", nargs="?", type=int, const=8000, metavar="PORT",
                   help="serve the built guide instead of building it")
    args = p.parse_args(argv)
    out = args.out.resolve()
    if args.serve is not None:
        serve(out, args.serve)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    cdn = copy_frontend(out)
    built_now, failed = {}, []
    for nb in notebooks(args.names):
        ok, secs, log = export(nb, out, args.timeout)
        page = out / f"{nb.stem}.html"
        if page.exists():
            localize(page, cdn)
        print(f"{'ok  ' if ok else 'FAIL'} {nb.name:28s} {secs:6.1f} s -> {page}", flush=True)
        if not ok:
            failed.append(nb.name)
            print(log, file=sys.stderr)
        built_now[nb.stem] = (ok, secs)
    print(f"index: {write_index(out, built_now)}")
    if failed:
        print(f"notebooks with errors: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
