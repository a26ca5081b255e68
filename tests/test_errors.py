"""Bad input ends with one line on stderr, exit status 2, no traceback, nothing written (issue: reliability)."""
import os
import shutil

import pytest

import train
from conftest import run_script, tiny_args


def snapshot(folder):
    """Every file under folder with its size and mtime: 'nothing written' means this does not change."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[path] = (os.path.getsize(path), os.path.getmtime(path))
    return found


def assert_clean_failure(result, *needles):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def trained_dir(char_dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("trained") / "out")
    train.train(train.resolve_config(tiny_args(char_dataset, out, max_iters=4, eval_interval=2)))
    return out


TRAIN_CASES = [
    (["--arch=rnn"], ["unknown --arch=rnn", "gpt"]),
    (["--arch=gpt", "--objective=mlm"], ["does not fit", "clm"]),
    (["--arch=bert", "--objective=ul2"], ["does not fit"]),
    (["--n_layr=4"], ["unknown option --n_layr", "did you mean --n_layer"]),
    (["--batch_size=many"], ["wrong type", "int"]),
    (["--learning_rate=fast"], ["wrong type"]),
    (["--n_embd=30", "--n_head=4"], ["not divisible"]),
    (["--dropout=1.5"], ["dropout"]),
    (["--batch_size=0"], ["batch_size"]),
    (["--device=cuda"], ["CUDA is not available"]),
    (["--dataset=nowhere"], ["unknown --dataset=nowhere"]),
    (["config/no_such_file.py"], ["not found"]),
    (["--init_from=gpt9"], ["scratch or resume"]),
    (["--max_iters"], ["needs a value"]),
    (["--weight_decay=-1"], ["weight_decay"]),
    (["--beta2=1.0"], ["beta2"]),
    (["--seed=-1"], ["seed"]),
    (["--device=cudax"], ["unknown --device=cudax"]),
    (["--ul2_mixture=('a','b','c')", "--arch=t5"], ["ul2_mixture"]),
    (["--n_decoder_layer=2"], ["t5 only"]),
    (["--block_size=4"], ["too small"]),
]


@pytest.mark.parametrize("args, needles", TRAIN_CASES)
def test_train_bad_arguments(char_dataset, tmp_path, args, needles):
    out = str(tmp_path / "out")
    base = tiny_args(char_dataset, out)
    overridden = {a.split("=")[0] for a in args}
    result = run_script("train.py", *[a for a in base if a.split("=")[0] not in overridden], *args)
    print(assert_clean_failure(result, *needles))
    assert not os.path.exists(out)


def test_train_missing_and_truncated_bin_files(char_dataset, tmp_path):
    for damage in ("missing", "truncated", "truncated_even", "meta"):
        data = tmp_path / damage
        shutil.copytree(char_dataset, data)
        if damage == "missing":
            os.remove(data / "val.bin")
        elif damage == "truncated":
            with open(data / "train.bin", "r+b") as f:
                f.truncate(33)
        elif damage == "truncated_even":  # a whole number of tokens, but fewer than meta.pkl promises
            with open(data / "train.bin", "r+b") as f:
                f.truncate(100_000)
        else:
            (data / "meta.pkl").write_bytes(b"not a pickle")
        out = str(tmp_path / f"out-{damage}")
        print(assert_clean_failure(run_script("train.py", *tiny_args(str(data), out)), str(data)))
        assert not os.path.exists(out)


def test_resume_refusals(char_dataset, trained_dir, tmp_path):
    before = snapshot(trained_dir)
    cases = [(["--block_size=64"], "block_size=32"), (["--n_layer=3"], "n_layer=2"), (["--arch=bert"], "arch=gpt")]
    for args, needle in cases:
        result = run_script("train.py", *tiny_args(char_dataset, trained_dir, init_from="resume"), *args)
        print(assert_clean_failure(result, "cannot resume", needle))
    # a dataset whose vocabulary differs from the checkpoint's
    other = tmp_path / "other"
    other.mkdir()
    (other / "text.txt").write_text("abc abc cab\n" * 500)
    from conftest import load_prepare
    load_prepare("shakespeare_char").prepare(str(other / "text.txt"), str(other))
    result = run_script("train.py", *tiny_args(str(other), trained_dir, init_from="resume"))
    print(assert_clean_failure(result, "vocabulary"))
    missing = str(tmp_path / "never-trained")
    print(assert_clean_failure(run_script("train.py", *tiny_args(char_dataset, missing, init_from="resume")),
                               "no checkpoint"))
    assert not os.path.exists(missing)
    assert snapshot(trained_dir) == before


def test_sample_bad_inputs(trained_dir, tmp_path):
    before = snapshot(trained_dir)
    cases = [
        ([f"--out_dir={trained_dir}", "--start=héllo"], "outside the vocabulary"),
        ([f"--out_dir={trained_dir}", "--start="], "prompt is empty"),
        ([f"--out_dir={trained_dir}", "--start=" + "a" * 40], "context is 32"),
        ([f"--out_dir={trained_dir}", "--start=FILE:/no/such/prompt.txt"], "not found"),
        ([f"--out_dir={tmp_path / 'nothing'}"], "no checkpoint"),
        ([f"--out_dir={trained_dir}", "--device=cuda"], "CUDA is not available"),
        ([f"--out_dir={trained_dir}", "--temperature=hot"], "wrong type"),
        ([f"--out_dir={trained_dir}", "--num_samples=0"], "num_samples"),
        ([f"--out_dir={trained_dir}", "--order=sideways"], "confident or random"),
        ([f"--out_dir={trained_dir}", "--temperature=1e-300"], "too small"),
    ]
    for args, needle in cases:
        print(assert_clean_failure(run_script("sample.py", *args), needle))
    assert snapshot(trained_dir) == before


def test_sample_runs_and_reports_speed(trained_dir):
    result = run_script("sample.py", f"--out_dir={trained_dir}", "--start=To be", "--num_samples=2",
                        "--max_new_tokens=40")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("To be") == 2 and "tokens/s" in result.stdout


def test_prepare_bad_inputs(tmp_path):
    for script in ("data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py"):
        print(assert_clean_failure(run_script(script, f"--input={tmp_path / 'missing.txt'}"), "does not exist"))
        print(assert_clean_failure(run_script(script, "--inptu=x"), "did you mean --input"))


def test_bench_bad_inputs():
    print(assert_clean_failure(run_script("bench.py", "--device=cuda"), "CUDA is not available"))
    print(assert_clean_failure(run_script("bench.py", "--sections=fast"), "unknown section"))
    print(assert_clean_failure(run_script("bench.py", "--repeats=many"), "wrong type"))
    print(assert_clean_failure(run_script("bench.py", "--repeatz=3"), "unknown option"))


def test_bench_quick_runs_every_section(tmp_path):
    """bench.py must not rot: the quick run exercises every section (no assertion on speed)."""
    out = tmp_path / "bench.json"
    result = run_script("bench.py", "--quick", f"--out={out}", "--plots=False")
    assert result.returncode == 0, result.stderr
    import json
    results = json.loads(out.read_text())
    for section in ("ceilings", "training", "attention", "decoding", "prefix"):
        assert section in results
    assert set(results["training"]) >= {"gpt", "bert", "prefixlm", "t5"}
    assert (tmp_path / "bench.md").exists() and "### 5." in result.stdout
