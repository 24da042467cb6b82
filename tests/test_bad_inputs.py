"""Bad input on the ``pagesim`` command line: exit code 2 and exactly one line on stderr naming the
parameter, file, row or field at fault; never a traceback, a hang or a silent default.

Each case is ``(argv, needle)``: ``needle`` (a regular expression) must appear in the one line.
Paths in braces (``{binary}``) are files written by the ``files`` fixture. Most cases run in
this process through ``sim.cli.main``; a few run the installed ``pagesim`` script, as a user
would. Every case runs under a timeout: a hang fails it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest

from pagesim.sim.cli import main
from pagesim.sim.cost.calibration import calibration_path
from pagesim.sim.errors import PagesimWarning

# --model: the vLLM paper's OPT-13B on its A100-40GB, whose pool the messages below name (a bare
# simulate runs today's defaults, sim.args.TODAYS_DEFAULTS)
CALIBRATIONS = calibration_path("a40").parent  # sim/data/calibration/
SIM = ["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "5", "--no-progress", "--model", "opt-13b"]
PLAN = ["plan", "--duration", "20", "--slo-ttft-p99", "2", "--no-progress", "--workers", "1"]


def sim(*flags: str) -> list[str]:
    return [*SIM, *flags]


def plan(*flags: str) -> list[str]:
    return [*PLAN, *flags]


def bad_number(flag: str, values, needle: str | None = None):
    """One case per value of ``flag``; the line must name the flag (or ``needle``)."""
    name = needle or flag.lstrip("-").replace("-", "_")
    return [(sim(flag, v), rf"{re.escape(flag)}|{name}") for v in values]


CASES = [
    # --- simulation settings: non-numbers, NaN, infinities, out of range, overflowing integers
    *bad_number("--kv-gib", ["nan", "inf", "0", "-1", "abc"], "kv_gib"),
    (sim("--kv-gib=-inf"), "kv_gib must be a finite number"),
    *bad_number("--gpu-memory-utilization", ["nan", "0", "1.5", "-0.1"]),
    *bad_number("--max-seq-len", ["0", "1", "-5", "1.5", "99999999999999999999"]),
    *bad_number("--tp", ["0", "-1", "x"], "tensor_parallel"),
    *bad_number("--block-size", ["0", "257", "1e3", "-16", "16.5"]),
    *bad_number("--predictor-error", ["nan", "-0.1", "inf"]),
    *bad_number("--vattention-page-kib", ["3", "0", "-64", "1000"]),
    *bad_number("--watermark", ["nan", "-0.1", "1", "2"]),
    *bad_number("--max-num-seqs", ["0", "-3", "99999999999999999999999"]),
    *bad_number("--max-num-batched-tokens", ["0", "1", "-1", "2047", "99999999999999999999999"]),
    *bad_number("--swap-gib", ["nan", "-1", "inf"]),
    *bad_number("--chunk-budget", ["0", "-1"]),
    *bad_number("--waiting-served-ratio", ["-1", "nan", "inf"]),
    *bad_number("--step-overhead-ms", ["-100", "nan", "inf"]),
    *bad_number("--per-seq-overhead-ms", ["-1", "nan"]),
    (sim("--per-seq-overhead-ms=-inf"), "per_seq_overhead_ms must be a finite number"),
    *bad_number("--seed", ["-1", "1.5", "abc"]),
    (sim("--system", "static", "--static-batch-size", "0"), "static_batch_size"),
    (sim("--system", "static", "--static-batch-size", "-2"), "static_batch_size"),
    (sim("--system", "static", "--static-batch-size", "100"), "static_batch_size"),
    # --- names and combinations
    (sim("--model", "gpt-9"), "unknown model 'gpt-9'"),
    (sim("--gpu", "tpu"), "unknown GPU 'tpu'"),
    (sim("--system", "foo"), "--system"),
    (sim("--manager", "foo"), "--manager"),
    (sim("--manager", "paged", "--scheduler", "static"), "scheduler 'static'"),
    (sim("--requests-format", "xml"), "--requests-format"),
    (sim("--model", "llama-2-70b", "--gpu", "a100-40gb"), "--tp"),
    # --- work that cannot fit in memory, refused before anything is allocated
    ([*SIM[:3], "--rate", "1e9", "--duration", "60", "--no-progress"], "1e\\+09 req/s for 60 s"),
    ([*SIM[:3], "--duration", "1e12", "--no-progress"], "2 req/s for 1e\\+12 s"),
    ([*SIM[:3], "--num-requests", "99999999999999", "--no-progress"], "1e\\+14 requests"),
    # (a KV pool whose tables overflow this machine's memory: tests/sim/test_limits.py)
    (sim("--kv-gib", "1e9"), "--kv-gib 1e\\+09 does not fit on a100-40gb: .* at most 16.1 GiB of KV"),
    (sim("--kv-gib", "17"), "--kv-gib 17 does not fit on a100-40gb"),
    # (replicas, each with its own pool's tables; a host tier's tables; counts past any request)
    (sim("--replicas", "10000000"), "10,000,000 replicas \\(--replicas\\), each with its own KV pool's"),
    (sim("--system", "vllm-v1", "--prefill-replicas", "10000000", "--decode-replicas", "1"),
     "10,000,001 replicas \\(--prefill-replicas \\+ --decode-replicas\\)"),
    (sim("--system", "vllm-v1", "--kv-offload-gib", "1e12"), "--kv-offload-gib 1e\\+12 \\(8.19e\\+13 blocks of 16\\)"),
    (sim("--system", "vllm-v1", "--num-speculative-tokens", "100000"),
     "num_speculative_tokens=100000 must be below max_seq_len=2048"),
    (sim("--system", "vllm-v1", "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-gbps", "inf"),
     "--kv-link-gbps: must be > 0, got inf"),
    (sim("--trace", "{negative_tokens}", "--columns", "prompt=a,prompt=b,output=c"),
     r"--columns: prompt= given twice \(a and b\): give it once"),
    (["cost", "error", "--measured", "{dir}", "--model", "llama-2-7b", "--gpu", "a100-80gb",
      "--cost-model", "calibrated", "--calibration", "{calibration_a40}"], "constants of a40, not of --gpu a100-80gb"),
    # (one setting under both its names, SGLang's and vLLM's)
    (sim("--system", "sglang", "--page-size", "4", "--block-size", "16"),
     r"--page-size 4 and --block-size 16 are one setting: give one"),
    # (speculative decoding an engine would refuse, or that says two things at once)
    (sim("--system", "vllm-v1", "--num-speculative-tokens", "2", "--spec-acceptance-rate", "0.5",
         "--spec-acceptance-rates", "0.9,0.1"), "--spec-acceptance-rates replaces --spec-acceptance-rate"),
    (sim("--system", "vllm-v1", "--model", "llama-2-7b", "--num-speculative-tokens", "2", "--speculative-method",
         "mtp"), "--speculative-method mtp: llama-2-7b ships no multi-token-prediction module"),
    (sim("--system", "vllm-v1", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--num-speculative-tokens", "2",
         "--speculative-method", "draft-model", "--draft-model", "llama-2-7b"),
     "--draft-model llama-2-7b: its vocabulary \\(32,000 tokens\\) is not llama-3.1-8b's \\(128,256\\)"),
    (sim("--system", "vllm-v1", "--model", "llama-2-13b", "--gpu", "a100-80gb", "--num-speculative-tokens", "2",
         "--speculative-method", "draft-model", "--draft-model", "llama-2-70b"),
     "--draft-model llama-2-70b \\(128.0 GiB of weights\\) is larger than llama-2-13b"),
    (plan("--system", "vllm-v1", "--model", "llama-2-7b", "--num-speculative-tokens", "2", "--speculative-method",
          "mtp"), "--speculative-method mtp: llama-2-7b ships no multi-token-prediction module"),
    # --- a pool below one block: what is wrong, not a max_seq_len of 0
    (sim("--kv-gib", "0.001"), "the KV pool holds 1 tokens, less than one block of 16: no request fits; use more "
                               "KV memory \\(--kv-gib 0.0122 or more\\) or a smaller --block-size"),
    (sim("--kv-gib", "0.0077", "--max-seq-len", "8", "--max-len-policy", "truncate"),
     "the KV pool holds 10 tokens, less than one block of 16"),
    # --- model configs an engine would refuse
    (sim("--system", "vllm-v1", "--model", "{mamba_only}", "--gpu", "h100"),
     "no full-attention layer beside its Mamba or linear-attention layers"),
    (sim("--model", "{no_hidden_size}"), "no_hidden_size.json: field 'hidden_size' missing \\(transformers would "
                                         "take its class default, 4096"),
    # --- workload flags
    (sim("--priority-weights", "1e308,1e308"), "--priority-weights: weights must be >= 0, not all 0, and sum to a "
                                               "finite number"),
    *[(sim("--rate", v), "--rate") for v in ("nan", "0", "-2", "inf", "abc")],
    *[(sim("--duration", v), "--duration") for v in ("0", "-1", "nan")],
    *[(sim("--num-requests", v), "--num-requests") for v in ("0", "-1", "1.5")],
    *[(sim("--cv", v), "--cv") for v in ("0", "nan")],
    (sim("--arrival", "foo"), "--arrival"),
    # (--cv shapes gamma arrivals alone)
    (sim("--cv", "2"), "--cv sets the variation of gamma arrivals; the arrivals are poisson: add --arrival gamma"),
    (sim("--cv", "2", "--arrival", "poisson"), "--cv sets the variation of gamma arrivals"),
    (plan("--cv", "3"), "--cv sets the variation of gamma arrivals"),
    (["trace", "synth", "--rate", "2", "--cv", "2", "-o", "{out}/t.csv"], "--cv sets the variation of gamma arrivals"),
    (["trace", "synth", "--num-requests", "5", "--seed", "-1", "-o", "{out}/t.csv"], "--seed: must be >= 0, got -1"),
    # how to read a trace file, with none given; synthetic arrivals' shape, with a trace given
    (sim("--format", "azure", "--hash-block-tokens", "16"),
     "--format, --hash-block-tokens read a trace file; there is no --trace: add one or drop them"),
    (sim("--spread-timestamps"), "--spread-timestamps read a trace file; there is no --trace"),
    (sim("--trace", "{one_arrival}", "--arrival", "gamma", "--cv", "5"),
     "--arrival, --cv shape synthetic arrivals; --trace .*one_arrival.csv has its own: drop them"),
    (["trace", "beam-search", "--num-requests", "2", "--width", "2", "--seed", "-1"], "--seed: must be >= 0, got -1"),
    (["trace", "synth", "--rate", "1e9", "--duration", "5", "-o", "{out}/t.csv"], "5e\\+09 requests, whose tables"),
    (["validate", "--against", "{empty}"], "empty.csv: cannot read as a fact table"),
    (["report", "{bad_run}"], "bad_run: saved results not as pagesim writes them"),
    (["cost", "error", "--measured", "{measured_latin}", "--model", "llama-2-7b", "--gpu", "a100-80gb"],
     "mlp.csv: not UTF-8 text"),
    (sim("--n", "0"), "--n"),
    (sim("--beam-width", "0"), "--beam-width"),
    *[(sim("--sample", v), "--sample") for v in ("0", "1.5", "-1")],
    *[(sim(f"--time-slice={v}"), "--time-slice") for v in ("5", "10:5", "-1:5", "a:b")],
    *[(sim("--rate-scale", v), "--rate-scale") for v in ("0", "nan")],
    (sim("--workload", "foo"), "--workload"),
    (sim("--max-len-policy", "foo"), "--max-len-policy"),
    # --- files named on the command line
    (sim("--model", "/nonexistent/config.json"), "/nonexistent/config.json"),
    (sim("--model", "{bad_json}"), "bad.json"),
    (sim("--model", "{list_json}"), "list.json"),
    (sim("--profile", "/nonexistent/profile.csv"), "/nonexistent/profile.csv"),
    (sim("--profile", "{garbage_csv}"), "garbage.csv"),
    (sim("--profile", "{binary}"), "binary.bin"),
    (sim("--trace", "/nonexistent/trace.csv"), "/nonexistent/trace.csv"),
    (sim("--trace", "{empty}"), "empty.csv"),
    (sim("--trace", "{dir}"), "adir"),
    (sim("--trace", "{garbage_csv}"), "garbage.csv"),
    (sim("--trace", "{negative_tokens}"), "negative.csv"),
    (sim("--trace", "{text_tokens}"), "text_tokens.csv"),
    (sim("--trace", "{priority_bool}"), "priority_bool.csv, row 1, field 'priority': a yes/no value \\(True\\), "
                                        "not a number"),
    # JSON's true is no number either (it read as 1: arrival 1 s, one token)
    (sim("--trace", "{jsonl_bool}"),
     "bool.jsonl, row 1, field 'prompt_tokens': a yes/no value \\(True\\), not a number"),
    (sim("--trace", "{jsonl_bool_time}"), "bool_time.jsonl, row 1, field 'arrival_s': a yes/no value \\(True\\), "
                                          "not a number"),
    (sim("--trace", "{priority_huge}"), "priority_huge.csv, row 2, field 'priority': must be below 2\\^62 in "
                                        "magnitude, got 1e\\+30: too large"),
    (sim("--trace", "{negative_time}"), "negative_time.csv, row 2, field 'arrival_s': timestamp must be a finite "
                                        "number >= 0, got -5$"),
    # (one bad row of a Mooncake file: that row refused, not every timestamp read as seconds)
    (sim("--trace", "{mooncake_bad_row}"), "mooncake_bad_row.jsonl, row 2, field 'hash_ids': must be a list of "
                                           "ceil\\(input_length / 512\\) = 2 block hashes, as the file's other rows "
                                           "are \\(Mooncake's\\), got a list of 3"),
    # --- settings that do nothing for the system (sim/systems.py; each checked in tests/sim/test_settings_apply.py)
    (sim("--system", "orca-max", "--block-size", "32"), "--block-size does nothing for system 'orca-max'"),
    (sim("--system", "orca-max", "--prefix-caching"), "--prefix-caching does nothing for system 'orca-max'"),
    (sim("--system", "vllm-v1", "--model", "gemma-2-27b", "--gpu", "h100", "--num-speculative-tokens", "3"),
     "prefix caching over sliding-window groups is not modelled with speculative decoding or "
     "--kv-offload-gib; add --no-prefix-caching"),
    (sim("--system", "vllm-v1", "--model", "gemma-2-27b", "--gpu", "h100", "--kv-offload-gib", "8"),
     "prefix caching over sliding-window groups is not modelled with speculative decoding or "
     "--kv-offload-gib; add --no-prefix-caching"),
    (sim("--system", "vllm-v1", "--model", "jamba-1.5-mini", "--gpu", "h100", "--tp", "2", "--num-speculative-tokens",
         "2"), "prefix caching over Mamba-state groups \\(align mode\\) is not modelled with speculative decoding or "
               "--kv-offload-gib; add --no-prefix-caching"),
    (sim("--system", "vllm-v1", "--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--tp", "4"),
     "gated-delta-net prefill checkpoints not modelled; add --no-prefix-caching"),
    (sim("--system", "vllm-v1", "--prefill-replicas", "1", "--decode-replicas", "1", "--num-speculative-tokens", "3"),
     "--num-speculative-tokens is not modelled with disaggregation yet"),
    (sim("--system", "vllm-v1", "--model", "gemma-2-27b", "--gpu", "h100", "--no-prefix-caching",
         "--prefill-replicas", "1", "--decode-replicas", "1"),
     "hybrid KV cache groups \\(sliding-window or Mamba state\\) are not modelled with disaggregation yet"),
    (sim("--system", "vllm-v1", "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-offload-gib", "8"),
     "--kv-offload-gib is not modelled with disaggregation yet"),
    # the host tier is keyed by prefix-cache hashes, which sliding-window groups refuse: never both
    (sim("--system", "vllm-v1", "--model", "gemma-2-27b", "--gpu", "h100", "--no-prefix-caching",
         "--kv-offload-gib", "8"), "--kv-offload-gib needs prefix caching"),
    (sim("--system", "vllm-v1", "--swap-gib", "8"), "--swap-gib does nothing .* it applies to the vllm and orca "
                                                     "schedulers"),
    # --- --config TOML files
    (sim("--config", "{toml_typo}"), "typo.toml: unknown setting 'blok_size'; did you mean 'block_size'\\?"),
    (sim("--config", "{toml_kv_gb}"), "kv_gb.toml: unknown setting 'kv_gb'; did you mean 'kv_gib'\\?"),
    (sim("--config", "{toml_bool_str}"), "bool_str.toml: prefix_caching must be true or false"),
    (sim("--config", "{toml_str_int}"), "str_int.toml: block_size must be an integer, got '32'"),
    (sim("--config", "{toml_float_int}"), "float_int.toml: block_size must be an integer, got 16.5"),
    (sim("--config", "{toml_true_int}"), "true_int.toml: max_num_seqs must be an integer, got True"),
    (sim("--config", "{toml_nan}"), "nan.toml: kv_gib must be a finite number"),
    (sim("--config", "{toml_inf}"), "inf.toml: step_overhead_ms must be a finite number"),
    (sim("--config", "{toml_table}"), "table.toml: unknown setting 'foo'"),
    (sim("--config", "{toml_invalid}"), "invalid.toml: invalid TOML"),
    (sim("--config", "{toml_system_int}"), "system_int.toml: system must be a string"),
    (sim("--config", "{toml_system_unknown}"), "system_unknown.toml: unknown system 'foo'"),
    (sim("--config", "{toml_rate}"), "rate.toml: unknown setting 'rate'"),
    (sim("--config", "{toml_negative}"), "negative.toml: max_num_seqs must be >= 1"),
    (sim("--config", "{toml_array}"), "array.toml: block_size must be an integer"),
    (sim("--config", "{bad_json}"), "bad.json: invalid TOML"),
    (sim("--config", "{toml_utf16}"), "utf16.toml: not a TOML text file"),
    (sim("--config", "{binary}"), "binary.bin: not a TOML text file"),
    (sim("--config", "{dir}"), "adir"),
    (sim("--config", "/nonexistent/run.toml"), "/nonexistent/run.toml: config file not found"),
    # --- plan
    *[(plan("--slo-ttft-p99", v), "--slo-ttft-p99") for v in ("nan", "0", "-1")],
    *[(plan("--goodput", v), "goodput") for v in ("0", "2", "nan")],
    (plan("--systems", "foo"), "unknown system\\(s\\) foo"),
    (plan("--start-rate", "0"), "--start-rate"),
    (plan("--min-rate", "nan"), "--min-rate"),
    (plan("--max-rate", "0"), "--max-rate"),
    (plan("--min-rate", "5", "--max-rate", "1"), "--min-rate 5.0 is above --max-rate"),
    *[(plan("--rtol", v), "--rtol") for v in ("0", "1", "nan")],
    (plan("--keepup-frac", "0"), "--keepup-frac"),
    *[(plan("--tp-options", v), "--tp-options") for v in ("0", "x")],
    (plan("--workers", "0"), "--workers"),
    (plan("--report"), "--report needs --out"),
    (plan("--rate-scale", "2"), "--rate-scale"),
    (["plan", "resources", "--duration", "20", "--slo-ttft-p99", "2", "--no-progress"], "--rate R"),
    (plan("--kv-max-gib", "0"), "--kv-max-gib"),
    (plan("compare-gpus", "--gpus", "h100,h100-80gb"), "--gpus: h100 and h100-80gb are the same GPU \\(h100-80gb\\)"),
    (plan("resources", "--rate", "2", "--kv-max-gib", "0.01"), "--kv-max-gib must be at least 0.25 GiB, the "
                                                                "smallest KV pool plan resources searches; got 0.01"),
    (plan("--trace", "{one_arrival}"), "one_arrival.csv: fewer than two distinct arrival times, so its rate cannot "
                                       "be rescaled to 1 req/s \\(--rate; plan rescales it for each probe\\)"),
    (sim("--out", "/proc/pagesim-out"), "/proc/pagesim-out: "),
    (plan("resources", "--rate", "2", "--what-if", "zzz"), "--what-if: unknown variant\\(s\\) zzz; valid: all, none, "
                                                          "or of block_size=8"),
    (plan("--what-if", "block_size=32"), "--what-if is for 'plan resources'; 'plan max-rate' has no use for it"),
    (plan("resources", "--rate", "2", "--router", "round-robin", "--max-replicas", "0"),
     "--max-replicas must be >= 1, got 0"),
    (plan("resources", "--rate", "2", "--max-replicas", "4"), "--max-replicas bounds the replicas searched behind "
                                                              "--router; give --router NAME"),
    (plan("--max-replicas", "4"), "--max-replicas is for 'plan resources'"),
    (plan("--dollars-per-gpu-hour", "0"), "--dollars-per-gpu-hour"),
    (plan("--seed", "-1"), "seed"),
    (plan("--kv-gib", "nan"), "kv_gib"),
    (plan("--config", "{toml_typo}"), "did you mean 'block_size'"),
    (["plan", "--duration", "1e9", "--slo-ttft-p99", "2", "--no-progress"], "a probe at 1 req/s"),
    (["plan", "mode-x", "--duration", "20"], "mode"),
    (["plan", "disaggregation", "--duration", "20", "--slo-ttft-p99", "2", "--gpus", "4"], "--rate R"),
    (plan("disaggregation", "--rate", "2"), "--gpus N"),
    (plan("disaggregation", "--rate", "2", "--gpus", "1"), "--gpus N"),
    (plan("disaggregation", "--rate", "2", "--gpus", "4", "--systems", "vllm"), "--systems"),
    (plan("disaggregation", "--rate", "2", "--gpus", "4", "--kv-link", "x"), "--kv-link"),
    (plan("disaggregation", "--rate", "2", "--gpus", "4", "--router", "prefix-affinity"), "--router"),
    (plan("disaggregation", "--rate", "2", "--gpus", "4", "--max-gpus", "1"), "--max-gpus"),
    (plan("disaggregation", "--rate", "2", "--gpus", "3", "--tp", "2", "--model", "llama-2-7b"), "--gpus"),
    (plan("disaggregation", "--rate", "2", "--gpus", "4", "--num-speculative-tokens", "2"),
     "--num-speculative-tokens"),
    (sim("--system", "sglang", "--no-prefix-caching"), "--no-prefix-caching: sglang caches prefixes in its radix "
                                                        "tree, always"),
    (sim("--report"), "--report needs --out DIR"),
    (["reproduce", "fig2", "--quick", "--out", "{out}", "--address", "ray://x:1"],
     "--address ray://x:1 is a Ray cluster's: give --executor ray with it"),
    (["trace", "beam-search", "--num-requests", "1", "--max-output", "4", "--width", "5000"],
     "--width 5000: the corpus has .* token types"),
    (["trace", "synth", "--num-requests", "5", "--prompt-dist", "uniform:low=1,high=4,foo=3", "-o", "{out}/s.csv"],
     "length distribution 'uniform:low=1,high=4,foo=3': uniform takes low, high, not foo"),
    (["reproduce", "fig2", "--quick", "--out", "{out}", "--cache-dir", "{binary}"],
     "--cache-dir .*binary.bin: exists and is not a folder"),
    # --- cost
    (["cost", "error", "--measured", "{dir}", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--worst", "-1"],
     "--worst must be >= 0, got -1"),
    (["cost", "import", "--measured", "{dir}", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--layers", "0",
      "--out", "{out}/p.csv"], "--layers must be >= 1, got 0"),
    # --- reproduce and report
    (["reproduce", "fig9", "--out", "{out}"], "fig9"),
    *[(["reproduce", "fig2", "--out", "{out}", "--scale", v], "--scale") for v in ("0", "nan", "-1", "1e12")],
    (["reproduce", "fig2", "--out", "{out}", "--workers", "0"], "--workers"),
    # (a scale so small a figure's trace draws no request: the figure's rate and duration are its own)
    (["reproduce", "fig12", "--out", "{out}", "--scale", "0.001", "--no-progress"],
     r"--scale 0.001 leaves a trace with no requests \(rate 0.1 req/s for 3.6 s\); raise --scale"),
    (["reproduce", "fig2", "--out", "{out}", "--executor", "dask"], "--executor"),
    (["reproduce", "fig2"], "--out"),
    (["report", "/nonexistent/run"], "/nonexistent/run"),
    (["report", "{dir}"], "adir"),
    (["report", "{empty}"], "empty.csv"),
    # --- trace subcommands and the top level
    (["trace", "stats", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    (["trace", "stats", "{garbage_csv}"], "garbage.csv"),
    (["trace", "synth", "--rate", "0", "-o", "{out}/t.csv"], "--rate"),
    (["nonsense"], "nonsense"),
    (["simulate", "--no-such-flag"], "--no-such-flag"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    toml = {
        "toml_typo": ("typo.toml", "blok_size = 32\n"),
        "toml_no_profile": ("no_profile.toml", 'profile = "absent.csv"\n'),
        "toml_kv_gb": ("kv_gb.toml", "kv_gb = 12\n"),
        "toml_bool_str": ("bool_str.toml", 'prefix_caching = "false"\n'),
        "toml_str_int": ("str_int.toml", 'block_size = "32"\n'),
        "toml_float_int": ("float_int.toml", "block_size = 16.5\n"),
        "toml_true_int": ("true_int.toml", "max_num_seqs = true\n"),
        "toml_nan": ("nan.toml", "kv_gib = nan\n"),
        "toml_inf": ("inf.toml", "step_overhead_ms = inf\n"),
        "toml_table": ("table.toml", "[foo]\nx = 1\n"),
        "toml_invalid": ("invalid.toml", "block_size = \n"),
        "toml_system_int": ("system_int.toml", "system = 3\n"),
        "toml_system_unknown": ("system_unknown.toml", 'system = "foo"\n'),
        "toml_rate": ("rate.toml", "rate = 5\n"),
        "toml_negative": ("negative.toml", "[simulation]\nmax_num_seqs = -1\n"),
        "toml_array": ("array.toml", "block_size = [16]\n"),
        "bad_json": ("bad.json", '{"hidden_size": 10'),
        "list_json": ("list.json", "[1, 2, 3]"),
        "garbage_csv": ("garbage.csv", "hello,world\n1,2\n"),
        "one_arrival": ("one_arrival.csv", "request_id,arrival_s,prompt_tokens,output_tokens\n0,0,10,10\n"),
        "empty": ("empty.csv", ""),
        "negative_tokens": ("negative.csv", "request_id,arrival_s,prompt_tokens,output_tokens\n0,0,10,10\n1,1,-5,10\n"),
        "text_tokens": ("text_tokens.csv", "request_id,arrival_s,prompt_tokens,output_tokens\n0,0,ten,10\n"),
        "priority_bool": ("priority_bool.csv", "request_id,arrival_s,prompt_tokens,output_tokens,priority\n"
                                               "0,0,10,10,True\n1,1,10,5,False\n"),
        "calibration_a40": ("a40.toml", CALIBRATIONS.joinpath("a40.toml").read_text()),
        "jsonl_bool": ("bool.jsonl", '{"request_id": 0, "arrival_s": 0, "prompt_tokens": true, "output_tokens": 5}\n'),
        "jsonl_bool_time": ("bool_time.jsonl",
                            '{"request_id": 0, "arrival_s": true, "prompt_tokens": 5, "output_tokens": 5}\n'),
        "priority_huge": ("priority_huge.csv", "request_id,arrival_s,prompt_tokens,output_tokens,priority\n"
                                               "0,0,10,10,1\n1,1,10,5,1e30\n"),
        "negative_time": ("negative_time.csv", "request_id,arrival_s,prompt_tokens,output_tokens\n0,0,10,10\n"
                                               "1,-5,10,5\n"),
        "mooncake_bad_row": ("mooncake_bad_row.jsonl", "".join(
            json.dumps({"timestamp": t, "input_length": 1000, "output_length": 5, "hash_ids": h}) + "\n"
            for t, h in ((0, [0, 1]), (3000, [0, 1, 2]), (4000, [0, 3])))),
        "mamba_only": ("mamba_only.json", json.dumps({  # Nemotron-H's shapes, its attention layers made Mamba's
            "model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M-M-", "num_hidden_layers": 8,
            "hidden_size": 4480, "intermediate_size": 15680, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 4096, "mamba_num_heads": 128,
            "mamba_head_dim": 80, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4})),
        "no_hidden_size": ("no_hidden_size.json", json.dumps({
            "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008,
            "vocab_size": 32000, "max_position_embeddings": 4096})),
    }
    paths = {}
    for key, (name, text) in toml.items():
        (d / name).write_text(text)
        paths[key] = str(d / name)
    (d / "utf16.toml").write_bytes("block_size = 16\n".encode("utf-16"))
    paths["toml_utf16"] = str(d / "utf16.toml")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    paths["binary"] = str(d / "binary.bin")
    (d / "adir").mkdir()
    paths["dir"] = str(d / "adir")
    (d / "bad_run").mkdir()  # a run folder whose summary.json is not JSON
    (d / "bad_run" / "summary.json").write_text("{bad")
    (d / "bad_run" / "steps.csv").write_text("step\n")
    paths["bad_run"] = str(d / "bad_run")
    measured = d / "measured" / "vidur-profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    measured.mkdir(parents=True)  # a measured table with a byte that is not UTF-8
    (measured / "mlp.csv").write_bytes(b"num_tokens,\xff\xfe\n1,2\n")
    paths["measured_latin"] = str(d / "measured")
    paths["out"] = str(d / "out")
    return paths


def fill(argv: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) if "{" in a else a for a in argv]


def assert_one_line(rc: int, err: str, needle: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("pagesim"), err
    assert re.search(needle, err), (needle, err)


def test_there_are_at_least_100_cases():
    assert len(CASES) >= 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(a[1:] if a[0] == "simulate" else a)[-60:]
                                                       for a, _n in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, needle, files, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PAGESIM_CACHE_DIR", str(tmp_path / "cache"))
    try:
        rc = main(fill(argv, files))
    except SystemExit as e:  # argparse's usage errors exit through SystemExit
        rc = e.code
    assert_one_line(rc, capsys.readouterr().err, needle)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, needle", [
    (sim("--kv-gib", "nan"), "kv_gib must be a finite number"),
    (sim("--config", "{binary}"), "not a TOML text file"),
    ([*SIM[:3], "--rate", "1e9", "--duration", "60", "--no-progress"], "requests, whose tables"),
    (sim("--block-size", "1e3"), "argument --block-size: invalid int value: '1e3'"),
    # a bare command (today's defaults) whose profile cannot be read: the error alone, no defaults line first
    (["simulate", "--config", "{toml_no_profile}", "--rate", "1", "--duration", "5", "--no-progress"],
     "absent.csv: profile file not found"),
    ([*PLAN, "--config", "{toml_no_profile}", "--json"], "absent.csv: profile file not found"),
    (["simulate", "--config", "{toml_no_profile}", "--replicas", "2", "--rate", "1", "--duration", "5",
      "--no-progress"],
     "absent.csv: profile file not found"),
    (["simulate", "--config", "{toml_no_profile}", "--prefill-replicas", "1", "--decode-replicas", "1", "--rate", "1",
      "--duration", "5", "--no-progress"], "absent.csv: profile file not found"),
])
def test_bad_input_through_the_installed_script(argv, needle, files):
    """The real process: what a user's shell sees."""
    script = [sys.executable, "-c", "import sys; from pagesim.sim.cli import main; sys.exit(main())"]
    p = subprocess.run(script + fill(argv, files), capture_output=True, text=True, timeout=100)
    assert p.stdout == ""
    assert_one_line(p.returncode, p.stderr, needle)


@pytest.mark.parametrize("out, needle", [
    ("{dir}", "--out .*adir: is a folder; give the file to write"),
    ("{empty}/a.toml", "--out .*empty.csv/a.toml: .*empty.csv is not a folder"),
])
def test_cost_fit_refuses_its_out_before_the_fit(out, needle, files, capsys, monkeypatch):
    """The fit takes minutes: an --out that cannot be written is refused before it reads anything."""
    import pagesim.sim.cost.cli as cost_cli
    monkeypatch.setattr(cost_cli, "read_measured", lambda *a, **k: pytest.fail("read before --out was checked"))
    rc = main(fill(["cost", "fit", "--measured", "{dir}", "--gpu", "a100-80gb", "--out", out], files))
    assert_one_line(rc, capsys.readouterr().err, needle)


def test_toml_key_suggestion_is_difflib_closest():
    """Worked by hand: difflib's ratio of 'blok_size' to 'block_size' is 2*9/19 = 0.95, far above
    its 0.6 cut-off; 'zzz' matches nothing, so every known key is listed instead."""
    from pagesim.sim.config import unknown_setting_message
    assert unknown_setting_message("blok_size", ["block_size", "kv_gib"]) == \
        "unknown setting 'blok_size'; did you mean 'block_size'?"
    assert unknown_setting_message("zzz", ["kv_gib", "block_size"]) == "unknown setting 'zzz'; valid: block_size, kv_gib"


@pytest.mark.parametrize("name, allowed, refused", [
    ("kv_gib", 1e-9, 0.0),  # strictly positive
    ("seed", 0, -1),  # zero allowed
    ("block_size", 256, 257),  # vLLM's largest block
    ("block_size", 1, 0),
    ("per_seq_overhead_ms", 0.0, -1e-12),
    ("max_num_seqs", 2**62, 2**62 + 1),  # the largest integer the int64 tables take with room to add
    ("vattention_page_kib", 2048, 2047),
    ("prefix_caching", False, 0),  # 0 is not a boolean
    ("watermark", 0.5, float("nan")),
])
def test_setting_bounds_at_the_edge(name, allowed, refused):
    from pagesim.sim.config import setting_problem
    assert setting_problem(name, allowed) is None
    assert name in setting_problem(name, refused)


def test_toml_values_of_the_right_type_still_work(tmp_path, capsys):
    """The checks refuse only what is wrong: an int where a float is wanted is a number (kv_gib = 3),
    a [simulation] table holds the same keys, dashes are underscores."""
    cfg = tmp_path / "ok.toml"
    cfg.write_text('system = "orca-max"\nprefix_caching = false\n[simulation]\nkv-gib = 3\nblock_size = 32\n')
    with pytest.warns(PagesimWarning, match="ok.toml: block-size does nothing for system 'orca-max'") as seen:
        assert main([*SIM, "--config", str(cfg), "--json"]) == 0
    assert len(seen) == 1  # a feature turned off (prefix_caching = false) applies anywhere
    assert json.loads(capsys.readouterr().out)["system"] == "orca-max"


def test_memory_limit_worked_by_hand(monkeypatch):
    """With 1 GiB of memory and 4,096 bytes per request, 2^30 / 2^12 = 262,144 requests fit and
    one more does not; 1 req/s for 262,144 s is the same count. A paged pool of 16-token blocks
    at 68 bytes each fits 2^30 // 68 = 15,790,320 blocks, i.e. 252,645,120 tokens."""
    from pagesim.sim import limits, run_memory
    from pagesim.sim.config import SimConfig
    from pagesim.sim.errors import ConfigError
    from pagesim.sim.specs import get_model
    monkeypatch.setattr(limits, "physical_memory_bytes", lambda: 1 << 30)
    monkeypatch.setattr(run_memory, "bytes_per_request", lambda cfg=None: 4096)  # (weighed: test_limits_estimate.py)
    run_memory.check_synthetic_workload(1.0, None, 262_144)
    run_memory.check_synthetic_workload(1.0, 262_144.0, None)
    with pytest.raises(ConfigError, match="262,145|2.62e\\+05 requests"):
        run_memory.check_synthetic_workload(1.0, None, 262_145)
    cfg, model = SimConfig.for_system("vllm"), get_model("opt-13b")
    limits.check_pool(cfg, model, 15_790_320 * 16, "given")
    with pytest.raises(ConfigError, match="1.58e\\+07 blocks of 16"):
        limits.check_pool(cfg, model, 15_790_321 * 16, "given")


def test_priority_scheduling_without_priorities_warns_in_one_line(capsys):
    """--scheduling-policy priority over requests of one priority (no column, no --priority-weights)
    is first come first served: said in one warning line within 100 columns, and the run goes on."""
    with pytest.warns(PagesimWarning) as seen:
        assert main(sim("--system", "vllm-v1", "--scheduling-policy", "priority", "--json")) == 0
    lines = [str(w.message) for w in seen]
    assert lines == ["--scheduling-policy priority: every priority is 0: first come first served"]
    assert len("pagesim: warning: " + lines[0]) <= 100
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagesimWarning)  # drawn priorities: no warning
        assert main(sim("--system", "vllm-v1", "--scheduling-policy", "priority", "--priority-weights", "1,4",
                        "--json")) == 0


def test_swap_without_swap_space_warns_in_one_line():
    """--preemption swap with --swap-gib 0 swaps nothing: every preemption recomputes, which the
    summary counts as swap fallbacks; said in one warning line, and the run goes on."""
    with pytest.warns(PagesimWarning) as seen:
        assert main(sim("--preemption", "swap", "--swap-gib", "0", "--json")) == 0
    lines = [str(w.message) for w in seen]
    assert lines == ["--preemption swap, --swap-gib 0: no swap space, every preemption recomputes"]
    assert len("pagesim: warning: " + lines[0]) <= 100


@pytest.mark.parametrize("system, capacity, max_seq_len, needle", [
    ("vllm", 0, 2048, "KV pool of 0 slots is smaller than one max_seq_len=2048 request; no request fits it"),
    ("orca-max", 1, 2048, "KV pool of 1 slots is smaller than one max_seq_len=2048 request; no request fits it"),
    ("vllm", 100, 2048, "use max_seq_len <= 100 or a larger pool"),
    # 10 slots, max_seq_len 8, blocks of 16: no block at all
    ("vllm", 10, 8, "KV pool of 10 slots \\(0 blocks of 16\\) cannot hold one max_seq_len=8 request; less than one "
                    "block, no request fits"),
])
def test_a_pool_below_one_request_never_advises_max_seq_len_0(system, capacity, max_seq_len, needle):
    """The manager's own check (sim/core/build.py pool_for, reached past the command line's
    checks by a library caller): a bound below 1 is no advice; it says what is wrong."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.core.build import pool_for
    from pagesim.sim.errors import ConfigError
    from pagesim.sim.specs import get_model, with_max_seq_len

    with pytest.raises(ConfigError, match=needle) as e:
        pool_for(SimConfig.for_system(system), capacity, with_max_seq_len(get_model("opt-13b"), max_seq_len))
    assert "<= 0" not in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("kind,kv,n,median_ms\ndecode,-1,4,1.0\n", "row 1, field 'kv': must be >= 0, got -1$"),
    ("kind,kv,n,median_ms\ndecode,1,4,-2.5\n", "row 1, field 'median_ms': must be a number > 0, got -2.5$"),
    ("kind,kv,n,median_ms\ndecode,1,4,\n", "row 1, field 'median_ms': is missing$"),
])
def test_measured_timings_name_a_cell_as_written(text, needle, tmp_path):
    """A measured attention table's bad cell is shown as a number (-1), never numpy's repr
    (np.int64(-1)), and an empty one as missing."""
    from pagesim.sim.cost.measured import read_attention
    from pagesim.sim.errors import ConfigError

    path = tmp_path / "attention.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle) as e:
        read_attention(path)
    assert "np." not in str(e.value)
