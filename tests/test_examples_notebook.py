"""The linescope GPU example notebook runs end to end in a real Jupyter kernel. On this
CPU-only machine it trains on the CPU and reports why GPU values are unavailable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (make setup)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (make setup)")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "notebooks" / "linescope_gpu.ipynb"


def test_gpu_notebook_runs_and_shows_the_unavailable_reasons(tmp_path, monkeypatch):
    # GIVEN no NVIDIA driver on this machine
    monkeypatch.setenv("GPUPROF_NVML_LIBRARY", str(tmp_path / "absent" / "libnvidia-ml.so.1"))
    nb_path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    # WHEN every cell runs in a fresh kernel
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
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
    assert "GPU time available: False - GPU measurements unavailable: NVML not available" in text
    assert "GPU peak memory available: False" in text
