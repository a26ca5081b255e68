"""study.py must not rot: its quick scale runs every experiment end to end (no assertion on the results)."""
import json

from conftest import run_script


def test_study_quick_runs_end_to_end(char_dataset, tmp_path):
    result = run_script("study.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "study-quick.json").read_text())
    assert set(data["models"]) == {"gpt", "bert", "prefixlm", "t5", "diffusion", "bert-100%-mask"}
    flops = [m["flops"] for m in data["models"].values()]
    budget = data["budget_flops"]
    assert all(budget <= f < 1.5 * budget for f in flops)  # equal compute, up to one step over
    assert "elbo_bits" in data["models"]["diffusion"] and "both sides (exact Bayes)" in data["models"]["gpt"]["cloze"]
    assert (tmp_path / "study-quick.md").read_text().count("|") > 50


def test_study_rejects_an_unknown_scale():
    result = run_script("study.py", "--scale=tpu")
    assert result.returncode == 2 and "unknown --scale=tpu" in result.stderr and "Traceback" not in result.stderr
