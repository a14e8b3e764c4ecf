"""The report over every part's record: derived ratios, the H100 targets of benchmarks/generation.md, one text table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.parts import PARTS
from terra.config.files import load_json


def load_records(out: Path) -> dict[str, dict]:
    """Every part JSON in ``out``, by part name (a torn one: one line naming it)."""
    return {n: load_json(out / f"{n}.json", "part record") for n in PARTS if (out / f"{n}.json").is_file()}


def greedy_agreement(a: list[int], b: list[int]) -> dict:
    """Token-by-token agreement of two greedy rollouts, and where they first differ (after that they drift)."""
    x, y = np.asarray(a), np.asarray(b)
    n = min(len(x), len(y))
    same = x[:n] == y[:n]
    return {
        "tokens": int(n),
        "agreement": float(same.mean()) if n else None,
        "first_mismatch": int(np.argmin(same)) if not same.all() else None,
        "distinct_tokens_bf16": int(len(np.unique(x))),
    }


def derived(records: dict[str, dict]) -> dict[str, Any]:
    """Ratios the targets are stated in: speed-ups, overhead vs plain Llama, FP8 effect."""
    single = {n: r["single"]["s_per_frame"] for n, r in records.items() if "single" in r}
    res: dict[str, Any] = {}
    if "hf" in single and "vllm" in single:
        res["vllm_speedup_vs_hf"] = single["hf"] / single["vllm"]
    if "eager" in single and "vllm" in single:
        res["cuda_graph_speedup"] = single["eager"] / single["vllm"]
    if "plain" in single and "vllm" in single:
        res["terra_overhead_single_pct"] = 100 * (single["vllm"] / single["plain"] - 1)

    def fps(name: str) -> dict[int, float]:
        return {row["rollouts"]: row["frames_per_s"] for row in records.get(name, {}).get("batched", [])}

    bf16, plain, fp8 = fps("batched"), fps("plain"), fps("fp8")
    res["terra_overhead_batched_pct"] = {b: 100 * (plain[b] / bf16[b] - 1) for b in bf16 if b in plain}
    res["fp8_speedup"] = {b: fp8[b] / bf16[b] for b in bf16 if b in fp8}
    if "greedy_tokens" in records.get("batched", {}) and "greedy_tokens" in records.get("fp8", {}):
        res["fp8_greedy"] = greedy_agreement(records["batched"]["greedy_tokens"], records["fp8"]["greedy_tokens"])
    res["targets"] = targets(records, res)
    return res


def targets(records: dict[str, dict], res: dict[str, Any]) -> dict[str, dict]:
    """The targets in benchmarks/generation.md (stated for an H100) against what was measured: value, bound, met."""
    found: dict[str, dict] = {}

    def check(name: str, value: float | None, bound: float, at_most: bool) -> None:
        if value is not None:
            found[name] = {"value": value, "bound": bound, "met": value <= bound if at_most else value >= bound}

    check("terra single stream s/frame <= 0.8", records.get("vllm", {}).get("single", {}).get("s_per_frame"), 0.8, True)
    check("vLLM speed-up over Transformers >= 40", res.get("vllm_speedup_vs_hf"), 40, False)
    fps64 = [row["frames_per_s"] for row in records.get("batched", {}).get("batched", []) if row["rollouts"] == 64]
    check("64 rollouts x 22 frames, frames/s >= 18", fps64[0] if fps64 else None, 18, False)
    overheads = [v for v in [res.get("terra_overhead_single_pct"), *res["terra_overhead_batched_pct"].values()]
                 if v is not None]
    check("action/position overhead vs plain Llama % <= 3", max(overheads) if overheads else None, 3, True)
    prefixes = [row["prefix"] for name in ("vllm", "batched") for row in
                ([records[name]["single"]] if "single" in records.get(name, {}) else [])
                + records.get(name, {}).get("batched", [])
                if "computed_tokens_max" in row.get("prefix", {})]
    if prefixes:
        worst = max(prefixes, key=lambda p: p["computed_tokens_max"] - p["target_computed_max"])
        check("prompt tokens recomputed per frame <= block + 6", worst["computed_tokens_max"],
              worst["target_computed_max"], True)
    return found


def table(records: dict[str, dict], failures: dict[str, str]) -> str:
    """One plain-text table over all parts, then the derived ratios."""
    lines = []
    env = next(iter(records.values()))["env"] if records else {}
    if env:
        lines.append(f"{env['gpu'] or env['cpu']} | torch {env['torch']} | vllm {env['vllm']} | "
                     f"transformers {env['transformers']} | {env['date_utc']}")
    header = f"{'part':8} {'configuration':40} {'B':>3} {'frames':>6} {'s/frame':>8} {'frames/s':>9} " \
             f"{'computed':>9} {'hit':>6} {'peak GB':>8}"
    lines += [header, "-" * len(header)]
    for name, r in records.items():
        peak = r.get("memory", {}).get("gpu_peak_used_gb")
        rows = ([r["single"]] if "single" in r else []) + r.get("batched", [])
        for row in rows:
            p = row.get("prefix", {})
            computed = f"{p['computed_tokens_max']}/{p['target_computed_max']}" if "computed_tokens_max" in p else "-"
            hit = f"{100 * p['hit_rate_mean']:.1f}%" if "hit_rate_mean" in p else "-"
            lines.append(
                f"{name:8} {r['description']:40} {row['rollouts']:>3} {row['frames_per_rollout']:>6} "
                f"{row['s_per_frame']:>8.3f} {row['frames_per_s']:>9.2f} {computed:>9} {hit:>6} "
                f"{'-' if peak is None else f'{peak:.1f}':>8}"
            )
    for name, why in failures.items():
        lines.append(f"{name:8} FAILED: {why}")
    lines.append("computed = max prompt tokens recomputed per later frame request / target (block size + action slots)")
    for name, r in records.items():  # where the time goes: inside engine.step vs our loop and add_request
        for row in ([r["single"]] if "single" in r else []) + r.get("batched", []):
            if "engine_steps" in row:
                rest = row["wall_s"] - row["engine_step_s"] - row["add_request_s"]
                lines.append(
                    f"time {name} B={row['rollouts']}: {row['engine_steps']} engine steps, "
                    f"{1e3 * row['engine_step_s'] / max(row['engine_steps'], 1):.2f} ms/step, "
                    f"{100 * row['engine_step_s'] / row['wall_s']:.1f}% in step, "
                    f"{100 * row['add_request_s'] / row['wall_s']:.1f}% in add_request, "
                    f"{100 * rest / row['wall_s']:.1f}% in our loop"
                )
    prof = records.get("profile", {}).get("profile")
    if prof:
        gpu = (f", GPU busy {prof['gpu_busy_ms_per_token']:.2f} ms of a {prof['gpu_span_ms_per_token']:.2f} ms span, "
               f"{prof['gpu_kernels_per_token']:.0f} kernels" if "gpu_busy_ms_per_token" in prof else "")
        lines.append(f"profile (engine core in-process, per generated token): "
                     f"{prof['ms_per_token_unprofiled']:.2f} ms wall{gpu}")
        lines.append("  CPU: " + ", ".join(f"{k} {v:.3f} ms" for k, v in prof["cpu_ms_per_token"].items()))
        for k in prof.get("top_kernels", []):
            lines.append(f"  GPU {k['ms_per_token']:.3f} ms ({k['calls_per_token']:.0f}x) {k['name']}")
    split = records.get("boundary", {}).get("boundary")
    if split:
        busy = "" if split["gpu_busy_pct"] is None else f", GPU busy {split['gpu_busy_pct']:.0f} %"
        lines.append(f"boundary (engine core in-process): {split['rollouts']} rollouts x {split['frames_per_rollout']} "
                     f"frames after {split['context']}, {split['frames_per_s']:.2f} frames/s{busy}; "
                     "share of the wall time:")
        lines.append("  " + ", ".join(f"{k} {v:.1f} %" for k, v in split["share_pct"].items()))
    e2e = records.get("e2e", {})
    if "e2e" in e2e:
        t, e = e2e["tokenizer"], e2e["e2e"]
        lines.append(f"tokenizer at {t['image_size'][0]}x{t['image_size'][1]}: encode {t['encode_frames_per_s']:.1f} "
                     f"frames/s, decode {t['decode_frames_per_s']:.1f} frames/s")
        lines.append(f"one {e['frames']}-frame rollout end to end ({e2e['settings']['backend']}): "
                     f"{e['total_s']:.2f} s = "
                     f"encode {e['encode_s']:.2f} + generate {e['generate_s']:.2f} + decode {e['decode_s']:.2f} "
                     f"+ write {Path(e.get('video', '.mp4')).suffix[1:].upper()} {e['write_s']:.2f}")
    result = derived(records)
    for key, value in result.items():
        if key != "targets" and (value or value == 0):
            lines.append(f"{key}: {json.dumps(value) if isinstance(value, dict) else f'{value:.3f}'}")
    for name, t in result["targets"].items():
        lines.append(f"target (H100) {name}: {t['value']:.3f} -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
