"""The linescope GPU example notebook runs end to end in a real Jupyter kernel. On this
CPU-only machine it trains on the CPU and reports why GPU values are unavailable."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from gpuprof_testutil import run_notebook

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (make setup)")
pytest.importorskip("nbclient", reason="nbclient is not installed (make setup)")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "notebooks" / "linescope_gpu.ipynb"


def test_gpu_notebook_runs_and_shows_the_unavailable_reasons(tmp_path):
    # GIVEN no NVIDIA driver on this machine
    env = dict(os.environ, GPUPROF_NVML_LIBRARY=str(tmp_path / "absent" / "libnvidia-ml.so.1"))
    nb_path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, nb_path)
    # WHEN every cell runs in a fresh kernel (driven from a child process: the Jupyter client's
    # event loop must not leak into this test process)
    done = tmp_path / "executed.ipynb"
    p = run_notebook(nb_path, done, tmp_path, cell_timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    nb = nbformat.read(done, as_version=4)
    texts, html = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("name") == "stdout":
                texts.append(out["text"])
            html.append(out.get("data", {}).get("text/html", ""))
    text = "".join(texts)
    # THEN it trained (on the CPU here), and showed the report inline and wrote it
    assert "device: cpu" in text and "step 0: loss" in text
    assert any("<iframe srcdoc=" in h for h in html)
    assert (tmp_path / "gpu_report.html").is_file()
    # AND the GPU values are unavailable with the recorded reason, CPU profiling continued
    assert "method: None" in text
    # the Scalene run first (its own NVML lookup finds no driver), then the native sampler
    assert "backend: scalene" in text and "backend: sampler" in text
    assert text.index("backend: scalene") < text.index("backend: sampler")
    assert "GPU time available: False - GPU measurements unavailable: NVML not available" in text
    assert "GPU peak memory available: False" in text
    assert (tmp_path / "gpu_report_sampler.html").is_file()


def test_readme_and_docs_name_the_backends_the_notebook_uses():
    # The notebook's %%linescope cells, in order, and what README and docs/linescope.md say
    # about it: the same backends with the same options, in the same order.
    nb = nbformat.read(NOTEBOOK, as_version=4)
    magics = [line.split(" -o ")[0].removeprefix("%%linescope ").strip()
              for cell in nb.cells if cell.cell_type == "code"
              for line in cell.source.splitlines()[:1] if line.startswith("%%linescope")]
    assert magics == ["--backend scalene --gpu", "--backend sampler --gpu --memory"]
    root = NOTEBOOK.parent.parent.parent
    for doc in ("README.md", "docs/linescope.md"):
        text = " ".join((root / doc).read_text().split())
        at = text.index("linescope_gpu.ipynb")
        about = text[at:at + 400]
        found = [m for m in magics if m in about]
        assert found == magics, (doc, about)
        assert about.index(magics[0]) < about.index(magics[1]), (doc, about)
