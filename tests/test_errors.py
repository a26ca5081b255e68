"""Bad input ends with one line on stderr, exit status 2, no traceback, nothing written."""
import math
import os
import shutil
import sys

import pytest
import torch

import train
from infra.configurator import UserError
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
    (["--init_from=gpt9"], ["could not load 'gpt9'"]),  # the name is checked before the dataset
    (["--init_from=resum"], ["did you mean resume?"]),
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
    number_file = tmp_path / "prompt.py"
    number_file.write_text("start = 2024\n")  # a number where sample.py reads text (the prompt)
    cases = [
        ([f"--out_dir={trained_dir}", "--start=héllo"], "outside the vocabulary"),
        ([f"--out_dir={trained_dir}", "--start="], "prompt is empty"),
        ([f"--out_dir={trained_dir}", "--start=" + "a" * 40], "context is 32"),
        ([f"--out_dir={trained_dir}", "--start=FILE:/no/such/prompt.txt"], "does not exist"),
        ([f"--out_dir={tmp_path / 'nothing'}"], "no checkpoint"),
        ([f"--out_dir={trained_dir}", "--device=cuda"], "CUDA is not available"),
        ([f"--out_dir={trained_dir}", "--temperature=hot"], "wrong type"),
        ([f"--out_dir={trained_dir}", "--num_samples=0"], "num_samples"),
        ([f"--out_dir={trained_dir}", "--order=sideways"], "confident, margin, random"),
        ([f"--out_dir={trained_dir}", "--temperature=1e-300"], "too small"),
        ([f"--out_dir={trained_dir}", "--temperature=1e300"], "too large"),
        ([f"--out_dir={trained_dir}", "--temperature=1e39", "--top_k=1"], "too large"),
        ([f"--out_dir={trained_dir}", "--temperature=nan"], "not a finite number"),
        ([f"--out_dir={trained_dir}", "--temperature=inf"], "not a finite number"),
        ([f"--out_dir={trained_dir}", "--temperature=-inf"], "not a finite number"),
        ([f"--out_dir={trained_dir}", "--compile=True", "--no_cache=True"], "drop one of them"),
        ([f"--out_dir={trained_dir}", "--compile=yes"], "choose auto, True or False"),
        ([f"--out_dir={trained_dir}", "--compile"], "the default: 'auto'"),  # a text option: auto, True, False
        ([str(number_file), f"--out_dir={trained_dir}"], 'write start = "2024"'),
    ]
    for args, needle in cases:
        print(assert_clean_failure(run_script("sample.py", *args), needle))
    assert snapshot(trained_dir) == before


@pytest.mark.slow
def test_sample_runs_and_reports_speed(trained_dir):
    result = run_script("sample.py", f"--out_dir={trained_dir}", "--start=To be", "--num_samples=2",
                        "--max_new_tokens=40")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("To be") == 2 and "tokens/s" in result.stdout
    # the default, --compile=auto: 40 steps of a 32-wide model do not repay a compile (decode_layout.compile_pays)
    assert "compiled decoding step" not in result.stdout
    # --compile=True (decode_layout.compiled_decode_step): greedy text identical to the eager step's
    texts = {}
    for compiled in (False, True):
        result = run_script("sample.py", f"--out_dir={trained_dir}", "--start=To be", "--num_samples=2",
                            "--max_new_tokens=40", "--temperature=0", f"--compile={compiled}")
        assert result.returncode == 0, result.stderr
        texts[compiled] = result.stdout.rsplit("gpt (", 1)[0]  # the samples, before the speed line
        assert ("compiled decoding step" in result.stdout) == compiled
    assert texts[True] == texts[False] and texts[True].count("To be") == 2


def test_prepare_bad_inputs(tmp_path):
    for script in ("data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py"):
        print(assert_clean_failure(run_script(script, f"--input={tmp_path / 'missing.txt'}"), "does not exist"))
        print(assert_clean_failure(run_script(script, "--inptu=x"), "did you mean --input"))


def test_bench_bad_inputs():
    print(assert_clean_failure(run_script("bench.py", "--device=cuda"), "CUDA is not available"))
    print(assert_clean_failure(run_script("bench.py", "--sections=fast"), "unknown section"))
    print(assert_clean_failure(run_script("bench.py", "--repeats=many"), "wrong type"))
    print(assert_clean_failure(run_script("bench.py", "--repeatz=3"), "unknown option"))


def test_a_decoding_rate_above_its_floor_is_flagged_with_its_reason(monkeypatch):
    """A floor that is a floor: bench.py (infra/bench_report.floor_bandwidths) keeps the higher of two bandwidth
    measurements (a busy moment cannot lower it), and a rate above the floor is never printed as a plain share:
    under the weights-sized copy's floor the caches served the weights, above it too the bandwidth was measured
    low."""
    from infra import bench_report
    from infra.timing import of_floor_text
    assert of_floor_text(93.1, 100.0, 150.0) == "93.1%"
    assert "caches" in of_floor_text(109.4, 100.0, 150.0) and of_floor_text(109.4, 100.0, 150.0).startswith("109.4%")
    assert "busy machine" in of_floor_text(160.0, 100.0, 150.0)
    measured = iter([20e9, 30e9])  # again before the floors, then the weights-sized copy
    monkeypatch.setattr(bench_report, "copy_bandwidth", lambda device, megabytes, repeats: next(measured))
    results = {"ceilings": {"copy_bandwidth": 16.8e9, "copy_bandwidth_measured": [16.8e9]}}
    model = torch.nn.Linear(512, 512)  # 1 MiB of float32 weights
    assert bench_report.floor_bandwidths("cpu", {"quick": False}, 1, results, model) == (20e9, 30e9)
    assert results["ceilings"]["copy_bandwidth_measured"] == [16.8e9, 20e9]
    measured = iter([10e9, 30e9])  # a busier moment before the floors: the start's figure stays
    assert bench_report.floor_bandwidths("cpu", {"quick": False}, 1, results, model)[0] == 20e9


def test_the_steps_that_repay_a_compile_are_its_time_over_what_a_step_saves():
    """4c's last column (the figures behind decode_layout.compile_pays): 33.5 s of compile, 271.7 -> 435.7
    tokens/s at one row saves 1.39 ms a step, repaid after ~24,000 steps; 8 rows at 979.2 -> 1,455.8 tokens/s (an
    earlier run) save 2.7 ms a step; no saving, never repaid."""
    from infra.speed_diagnostics import steps_to_repay
    assert steps_to_repay(33.5, 271.7, 435.7, 1) == pytest.approx(33.5 / (1 / 271.7 - 1 / 435.7))
    assert 24_000 < steps_to_repay(33.5, 271.7, 435.7, 1) < 24_400
    assert 12_000 < steps_to_repay(33.1, 979.2, 1455.8, 8) < 13_000
    assert steps_to_repay(0.0, 1831.7, 1569.0, 32) is None and steps_to_repay(1.0, 500.0, 500.0, 1) is None


@pytest.mark.optional_packages  # 4d compares with transformers where it is installed
@pytest.mark.slow
def test_bench_quick_runs_every_section(tmp_path):
    """bench.py must not rot: the quick run exercises every section and its compiled rows (no assertion on
    speed)."""
    out = tmp_path / "bench.json"
    result = run_script("bench.py", "--quick", f"--out={out}", "--plots=False")
    assert result.returncode == 0, result.stderr
    import json
    results = json.loads(out.read_text())
    for section in ("ceilings", "training", "attention", "decoding", "prefix", "profile"):
        assert section in results
    for case in ("decoding, batch 1, eager", "decoding, batch 32, eager", "training, eager"):  # (compiled: below)
        profiled = results["profile"][case]  # one thread's operators: their self times are a part of the wall time
        assert 0 < profiled["in_operators"] <= 1.0 and profiled["calls_per_step"] >= 1, case
    assert any(o["name"] in ("aten::mm", "aten::addmm") for o in results["profile"]["decoding, batch 32, eager"]["top"])
    assert set(results["training"]) >= {"gpt", "bert", "prefixlm", "t5"}
    turns, u = results["turns"], results["turns"]["message_tokens"]  # 7: the chat's accounting (claim D4)
    assert turns["gpt"]["tokens"][1:] == [2 * u] * (turns["turns"] - 1)  # its own tokens only, every turn
    for arch in ("prefixlm", "t5"):  # the whole history again: each turn 2 u tokens more than the last
        assert [b - a for a, b in zip(turns[arch]["tokens"], turns[arch]["tokens"][1:])] == [2 * u] * (turns["turns"] - 1)
    assert (tmp_path / "bench.md").exists() and "### 5." in result.stdout
    # the compiled rows ran (the GPU recipe's paths, on the CPU), once each: training, FlexAttention, decoding
    assert results["training"]["gpt"]["compiled"]["ms_per_step"] > 0
    flex = results["attention"]["FlexAttention, causal block mask"]
    assert flex["max_error_vs_sdpa"] < 1e-5, flex  # (the other masks: the test below)
    assert {f"{arch}, batch 1, {m}" for arch in ("gpt", "t5") for m in ("eager", "compiled")} <= \
        set(results["compiled_decoding"])
    assert "compile_repaid_after_steps" in results["compiled_decoding"]["gpt, batch 1, compiled"]
    try:  # 4d: against transformers' generate on the same weights, where transformers is installed
        import transformers  # noqa: F401
    except ImportError:
        assert "4d. Against Hugging Face transformers: skipped" in result.stdout
    else:  # greedy on the same weights: our cached sampler writes their tokens (--quick: eager only)
        assert all(results["hugging_face_decoding"]["same_tokens"].values())
        assert len(results["hugging_face_decoding"]["samplers"]) == 2


@pytest.mark.slow
def test_bench_compiled_diagnostics_that_quick_leaves_out():
    """What bench.py --quick skips to stay under a minute, run here on tiny inputs: FlexAttention's prefix-LM and
    document masks against SDPA with the same masks, and the profile of a compiled decoding step."""
    from infra import speed_diagnostics
    from model import ModelConfig, Transformer
    q, k, v = (torch.randn(2, 2, 64, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    rows = speed_diagnostics.flex_attention_rows("cpu", q, k, v, 64, repeats=1)
    for mask in ("causal block mask", "prefix-LM block mask", "causal within 4 documents"):
        flex = rows[f"FlexAttention, {mask}"]
        assert flex["max_error_vs_sdpa"] < 1e-5, flex  # the same attention as SDPA with the same mask, float32
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="gpt", vocab_size=60, block_size=32, n_layer=1, n_head=2, n_embd=32)).eval()
    ids = torch.randint(0, 60, (1, 32), generator=torch.Generator().manual_seed(0))
    profiled = speed_diagnostics.profile_decoding(model, ids, "cpu", steps=2)
    for case in ("batch 1, compiled", "batch 32, compiled"):
        assert 0 < profiled[case]["in_operators"] <= 1.0 and profiled[case]["calls_per_step"] >= 1, case


# ----------------------------------------------------------------------------- round 2: values that used to crash

def user_error(function, *args):
    """The one-line message a UserError carries (run_main prints it and exits 2; tested above as a subprocess)."""
    with pytest.raises(UserError) as caught:
        function(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


def run_in_process(module, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *args])
    return module.main()


def test_values_that_pass_a_comparison_but_are_not_numbers(char_dataset, tmp_path):
    config_file = tmp_path / "nan.py"
    config_file.write_text("learning_rate = float('nan')\n")
    base = tiny_args(char_dataset, str(tmp_path / "o"))
    print(user_error(train.resolve_config, [str(config_file), *base]))
    assert "not a finite number" in user_error(train.resolve_config, [*base, "--learning_rate=1e999"])
    assert "--seed=18446744073709551616 is out of range" in user_error(train.resolve_config,
                                                                      [*base, "--seed=18446744073709551616"])
    assert "ul2_mixture" in user_error(train.resolve_config, [*base, "--arch=t5", "--ul2_mixture=(1e999,0,0)"])
    assert not os.path.exists(tmp_path / "o")


def test_config_files_are_python_helpers_are_ignored_folders_refused(tmp_path):
    helper = tmp_path / "helper.py"
    helper.write_text("import math\ndef double(x):\n    return 2 * x\nn_layer = double(2)\nbatch_size = int(math.sqrt(64))\n")
    config = train.resolve_config([str(helper)])
    assert config["n_layer"] == 4 and config["batch_size"] == 8
    assert "is a folder" in user_error(train.resolve_config, [str(tmp_path)])


def test_sample_refuses_what_cannot_be_done(trained_dir, tmp_path, monkeypatch):
    import sample
    out = f"--out_dir={trained_dir}"
    assert "not a finite number" in user_error(run_in_process, sample, monkeypatch, out, "--temperature=1e999")
    assert "GiB" in user_error(run_in_process, sample, monkeypatch, out, "--max_new_tokens=10000000000")
    assert "GiB" in user_error(run_in_process, sample, monkeypatch, out, "--num_samples=100000000")
    assert "--steps is for iterative unmasking" in user_error(run_in_process, sample, monkeypatch, out, "--steps=8")
    assert "--order is for" in user_error(run_in_process, sample, monkeypatch, out, "--order=random")
    assert "not a regular file" in user_error(run_in_process, sample, monkeypatch, out, "--start=FILE:/dev/zero")
    assert "is a folder" in user_error(run_in_process, sample, monkeypatch, out, f"--start=FILE:{tmp_path}")
    log = os.path.join(trained_dir, "log.jsonl")
    assert "not a checkpoint torch can read" in user_error(run_in_process, sample, monkeypatch, out,
                                                           f"--checkpoint={log}")
    assert "is a folder" in user_error(run_in_process, sample, monkeypatch, out, f"--checkpoint={tmp_path}")


def test_sample_refuses_no_cache_for_bert(char_dataset, tmp_path, monkeypatch):
    import sample
    out = str(tmp_path / "bert")
    train.train(train.resolve_config(tiny_args(char_dataset, out, arch="bert", max_iters=2, eval_interval=2)))
    assert "--no_cache does not apply to bert" in user_error(run_in_process, sample, monkeypatch, f"--out_dir={out}",
                                                             "--no_cache=True")


def damaged_copy(trained_dir, tmp_path, name, change):
    from infra import checkpoint
    folder = tmp_path / name
    shutil.copytree(trained_dir, folder)
    state = torch.load(folder / "ckpt.pt", weights_only=False)
    change(state)
    checkpoint.save_checkpoint(state, str(folder / "ckpt.pt"))
    return str(folder)


def test_well_formed_but_wrong_checkpoints(char_dataset, trained_dir, tmp_path, monkeypatch):
    import sample
    cases = {
        "none": (lambda s: s.update(model=None, config=None), "not a checkpoint of this project"),
        "unknown-key": (lambda s: s["model_config"].update(n_experts=8), "does not know: n_experts"),
        "weights": (lambda s: s["model"].pop("token_embedding.weight"), "weights do not fit"),
        "shapes": (lambda s: s["model_config"].update(n_embd=64), "weights do not fit"),  # train.py builds from
        "meta": (lambda s: s.update(meta=["not", "a", "dict"]), "meta of the wrong type"),  # its config: sample only
    }
    for name, (change, needle) in cases.items():
        folder = damaged_copy(trained_dir, tmp_path, name, change)
        assert needle in user_error(run_in_process, sample, monkeypatch, f"--out_dir={folder}"), name
        if name == "shapes":
            continue
        resumed = tiny_args(char_dataset, folder, init_from="resume", max_iters=6)
        message = user_error(train.train, train.resolve_config(resumed))
        assert needle in message or "cannot resume" in message, (name, message)


def test_wrong_meta_files(char_dataset, tmp_path):
    import pickle
    for name, change, needle in (("list", lambda m: ["a", "list"], "not a meta.pkl of this project"),
                                 ("no-specials", lambda m: {k: v for k, v in m.items() if k != "specials"}, "specials"),
                                 ("small-vocab", lambda m: dict(m, vocab_size=10), "holds token id")):
        data = tmp_path / name
        shutil.copytree(char_dataset, data)
        meta = pickle.loads((data / "meta.pkl").read_bytes())
        (data / "meta.pkl").write_bytes(pickle.dumps(change(meta)))
        out = str(tmp_path / f"out-{name}")
        assert needle in user_error(train.train, train.resolve_config(tiny_args(str(data), out))), name
        assert not os.path.exists(out)


def test_prepare_refuses_a_vocabulary_beyond_uint16(tmp_path):
    text = tmp_path / "many.txt"
    text.write_text("".join(chr(c) for c in range(0x4E00, 0x4E00 + 70_000) if not 0xD800 <= c < 0xE000) + "\n",
                    encoding="utf-8")
    result = run_script("data/shakespeare_char/prepare.py", f"--input={text}")
    print(assert_clean_failure(result, "does not fit uint16"))
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "shakespeare_char")
    assert not any(name.endswith(".tmp") for name in os.listdir(folder))


def test_chunked_encoding_gives_the_same_ids():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
    import prepare_common
    text = "First Citizen:\n\n\nBefore we proceed any further, hear me speak.\n  \nAll:\nSpeak, speak.\n" * 50
    tokens = list(text.encode())  # a byte-level stand-in whose cuts would show as a changed sequence
    pieces = []
    ids = prepare_common.encode_with_progress(text, lambda part: pieces.append(part) or list(part.encode()), 100)
    assert ids == tokens and len(pieces) > 10 and all(p[-1] != "\n" or p == pieces[-1] for p in pieces[:-1])


def test_bench_out_has_one_meaning(tmp_path):
    print(assert_clean_failure(run_script("bench.py", f"--out={tmp_path}"), "must name a .json"))
    folder = tmp_path / "x.json"
    folder.mkdir()
    print(assert_clean_failure(run_script("bench.py", f"--out={folder}"), "is a folder"))
    print(assert_clean_failure(run_script("bench.py", f"--out={tmp_path / 'r.md'}"), "must name a .json"))


def test_study_refuses_a_huge_seed():
    print(assert_clean_failure(run_script("experiments/study.py", "--quick", "--seed=18446744073709551616"), "out of range"))


def test_sample_compile_needs_a_decoding_step_to_compile():
    """--compile=True compiles the cached one-token step: bert has none (claim D4), and --no_cache turns it off."""
    import sample
    from infra.sample_options import check_sample_config

    def check(config, *request):
        return check_sample_config(config, sample.DEFAULTS, sample.UNMASK_ORDERS, *request)
    compiled = dict(sample.DEFAULTS, compile=True)
    assert "bert has no such step" in user_error(check, compiled, "bert", 3, 32, "mlm")
    assert "drop one of them" in user_error(check, dict(compiled, no_cache=True), "gpt", 3, 32, "clm")
    check(compiled, "t5", 3, 32, "span_corruption")  # accepted
    check(dict(sample.DEFAULTS, max_new_tokens=20), "bert", 3, 32, "mlm")  # auto: accepted


def test_sample_compile_auto_compiles_where_the_generation_repays_it(monkeypatch):
    """--compile=auto (the default) compiles the decoding step where decode_layout.compile_pays says the steps repay
    the compile: a CPU model FROZEN_MIN_WIDTH wide, one row, enough steps; never bert, never --no_cache, never
    without a C++ compiler; True and False as given."""
    import sample
    from infra import decode_layout, sample_options
    from model import ModelConfig, Transformer

    def model(arch="gpt", n_embd=decode_layout.FROZEN_MIN_WIDTH):
        return Transformer(ModelConfig(arch=arch, vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=n_embd))

    repaid = math.ceil(decode_layout.COMPILE_SECONDS / decode_layout.SECONDS_SAVED_PER_STEP)  # ~35,000 steps
    assert 10_000 < repaid < 60_000
    auto = dict(sample.DEFAULTS, num_samples=1, max_new_tokens=repaid)
    choice = sample_options.compile_choice
    monkeypatch.setattr(sample_options, "check_compiler", lambda device: None)  # a C++ compiler is there
    wide = model()
    assert choice(auto, wide, "cpu") is True
    assert choice(dict(auto, max_new_tokens=repaid - 1), wide, "cpu") is False
    assert choice(dict(auto, num_samples=2), wide, "cpu") is False  # one row only
    assert choice(auto, model(n_embd=decode_layout.FROZEN_MIN_WIDTH // 2), "cpu") is False  # unmeasured
    assert choice(auto, model("bert"), "cpu") is False
    assert choice(dict(auto, no_cache=True), wide, "cpu") is False
    assert choice(dict(auto, compile=True, max_new_tokens=1), wide, "cpu") is True
    assert choice(dict(auto, compile=False), wide, "cpu") is False

    def no_compiler(device):
        raise UserError("needs a C++ compiler")
    monkeypatch.setattr(sample_options, "check_compiler", no_compiler)
    assert choice(auto, wide, "cpu") is False


def test_digits_that_are_not_ascii_and_a_binary_text_are_one_line_each(tmp_path):
    """python exercises/check.py with a superscript or an Arabic-Indic digit (str.isdigit says yes to both) is a
    usage error, not a traceback nor exercise 1; published_claims.py --text=<a binary file> reads it as every script
    reads a text file; reversal.py --budget=nan is a number that is not finite."""
    for argument in ("\u00b2", "\u00b3", "\u0661"):
        result = run_script("exercises/check.py", argument)
        assert result.returncode == 2 and "pass the numbers of exercises" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "solved" not in result.stdout
    binary = tmp_path / "binary"
    binary.write_bytes(bytes(range(256)) * 4)
    print(assert_clean_failure(run_script("experiments/published_claims.py", f"--text={binary}"), "not UTF-8"))
    print(assert_clean_failure(run_script("experiments/reversal.py", "--quick", "--budget=nan",
                                          f"--out_dir={tmp_path / 'r'}"), "not a finite number"))
    assert not (tmp_path / "r").exists()



def test_a_stopped_benchmark_writes_what_finished_and_exits_as_a_stop(tmp_path):
    """One convention for every command: a stop (SIGTERM, Ctrl-C) ends with status 130, having kept what finished."""
    import signal
    import subprocess
    import sys
    from conftest import ROOT
    out = tmp_path / "b.json"
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--quick", "--compile=False",
                                f"--out={out}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in process.stdout:
        if line.startswith("[bench] section 2/"):  # ceilings done
            break
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, (process.returncode, stderr)
    assert "interrupted: sections not done" in stdout and out.exists() and (tmp_path / "b.md").exists()


def test_an_experiments_scale_and_seeds_are_checked_before_any_work(tmp_path):
    """--scale is checked even where --quick wins over it, and every seed an experiment will use is checked at
    once: the base seed plus its number of seeds must stay a valid seed (not a failure after the first seed)."""
    for args, needle in ((["--quick", "--scale=unknown"], "unknown --scale=unknown"),
                         (["--seed=4294967295"], "its 3 seeds run up to 4294967297")):
        print(assert_clean_failure(run_script("experiments/reversal.py", *args, f"--out_dir={tmp_path / 'r'}"),
                                   needle))
        assert not (tmp_path / "r").exists()


def test_a_stray_or_partial_torchrun_environment_is_one_line_and_a_closed_stdout_no_traceback(tmp_path):
    """RANK with no WORLD_SIZE (a traceback before), RANK=1 of a world of 1 (a silent hang before): data parallel
    mode needs a complete, consistent torchrun environment, else one line. A command started with its standard
    output closed (>&-) runs, with no AttributeError from a missing stream."""
    import subprocess
    import sys
    from conftest import ROOT
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    for extra, needle in (({"RANK": "0"}, "not a consistent torchrun set (WORLD_SIZE"),
                          ({"RANK": "1", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": "29512"}, "RANK=1 of WORLD_SIZE=1")):
        result = run_script("train.py", f"--out_dir={tmp_path / 'o'}", env={**base, **extra}, timeout=120)
        print(assert_clean_failure(result, needle))
        assert not (tmp_path / "o").exists()
    closed = subprocess.run(f'"{sys.executable}" "{os.path.join(ROOT, "sample.py")}" --out_dir="{tmp_path}" >&-',
                            shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT)
    print(assert_clean_failure(closed, "no checkpoint"))


def test_an_empty_tokenizer_name_is_refused_as_such(tmp_path):
    """data/shakespeare/prepare.py --tokenizer= (empty): said as an empty name, not as a missing transformers."""
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be.\n" * 50)
    print(assert_clean_failure(run_script("data/shakespeare/prepare.py", f"--input={text}", "--tokenizer="),
                               "--tokenizer is empty"))


def test_quick_and_another_scale_together_are_refused():
    result = run_script("experiments/encoders.py", "--quick", "--scale=gpu")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "encoders.py: error: --quick runs the smoke scale, not --scale=gpu: give one of the two"]


def test_sample_says_which_step_decoded(specials, meta, monkeypatch):
    """The line after the samples names the step that ran: --compile=True with more than COMPILED_MAX_ROWS rows of a
    model FROZEN_MIN_WIDTH wide on a CPU decodes with the eager step and says so; with fewer rows, the compiled
    step's note; the default (auto) for a short generation, neither: generate is asked for the eager step."""
    import sample
    from infra import decode_layout
    from model import ModelConfig, Transformer
    asked = []
    monkeypatch.setattr(sample, "generate", lambda model, prompt, new, sampling, stop, compiled:
                        asked.append(compiled) or torch.zeros((prompt.size(0), 4), dtype=torch.long))
    wide = Transformer(ModelConfig(arch="gpt", vocab_size=meta["vocab_size"], block_size=16, n_layer=1, n_head=2,
                                   n_embd=decode_layout.FROZEN_MIN_WIDTH))
    many = decode_layout.COMPILED_MAX_ROWS + 1
    for config, note in ((dict(compile=True, num_samples=many), "the eager step"),
                         (dict(compile=True, num_samples=1), "compiled decoding step"),
                         (dict(num_samples=1), None)):
        _, how = sample.generate_left_to_right(wide, [5, 6], "clm", specials, dict(sample.DEFAULTS, **config),
                                               None, None)
        assert ("the eager step" in how) == (note == "the eager step"), how
        assert ("compiled decoding step" in how) == (note == "compiled decoding step"), how
    assert asked == [True, True, False]
