"""CosyVoice 2 live pieces, part by part, each against its baseline in the same process: HiFT eager vs replayed from
its CUDA graph per piece length (engines/cosyvoice/hift_graph.py), the flow's padded solve at 1 row vs several
sessions' solves as rows of one (engines/cosyvoice/flow_batch.py, `serve --tts-batch`), and the LM's decode step of
one generation vs the batched step of several (engines/cosyvoice/lm_batch.py, `--tts-batch`'s LM half), and the
flow solve with fewer kernels (engines/cosyvoice/flow_kernels.py: q/k/v fused, blocks compiled; `--sections
flow_kernels`) against the serving solve, and the flow's token encoder eager vs from CUDA graphs
(engines/cosyvoice/flow_encoder.py, `--sections encoder`).

Random-weight release of the released architecture (`--size full`; `reduced` for a CPU smoke run). Per HiFT length
(mel frames of a live piece): median and min-max of --repeats calls after a warm-up call, eager and from the graph, with the same source
draws, and the largest difference of their waveforms; the capture's time and the GPU memory the graphs reserve. Per
row count: the solve's median time and the time per row against one row's (the batching's gain), and how far row 0
of the batched solve is from its solve alone. The device is synchronised around every timed call.

  python benchmarks/gpu_tts_pieces.py --device cuda --work /tmp/tts_pieces --out $OUT/gpu_tts_pieces.json
  python benchmarks/gpu_tts_pieces.py --device cpu --size reduced --repeats 1 --lengths 8,16 --rows 1,2 \\
      --flow-frames 64 --work /tmp/tts_pieces --out /tmp/tts_pieces.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

import_pack()


def _timed(fn, sync, repeats: int) -> tuple[dict, object]:
    """(times of `repeats` calls after one untimed warm-up call, the last call's result)."""
    times, out = [], fn()
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(1000 * (time.perf_counter() - t0))
    return {"median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "max_ms": round(max(times), 3), "n": len(times)}, out


def build_runtime(size: str, device: str, folder: Path):
    from gpu_cosyvoice import release_yaml

    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.random_release import write_random_release

    if not (folder / "hift.pt").is_file():
        text, qwen = release_yaml(size)
        write_random_release(folder, text, qwen, seed=1234)
    # the serving fast path on CUDA; on the CPU its padded solver in FP32 (no compile, no graphs)
    fast = FastPath() if device.startswith("cuda") else FastPath(lm_compile=False, flow_half=False)
    return CosyVoice2Runtime(folder, device, fast=fast)


def _exact_fp32(fn):
    """fn() with TF32 off for cuDNN convolutions and matrix products (torch's cuDNN default is on), restored after."""
    import torch

    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return fn()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


def hift_section(runtime, lengths: list[int], repeats: int, sync) -> dict:
    import torch

    from digital_human.engines.cosyvoice.hift import draw_source
    from digital_human.engines.cosyvoice.hift_graph import HiftGraphs

    cuda = runtime.device.type == "cuda"
    graphs = HiftGraphs(runtime.hift)
    reserved0 = torch.cuda.memory_reserved(runtime.device) if cuda else 0
    sync()
    t0 = time.perf_counter()
    captured = graphs.prepare(lengths)
    sync()
    out = {"graphs": captured, "capture_s": round(time.perf_counter() - t0, 2),
           "graphs_reserved_mib": round((torch.cuda.memory_reserved(runtime.device) - reserved0) / 2 ** 20, 1)
           if cuda else None, "lengths": {}}
    g = torch.Generator().manual_seed(0)
    cfg = runtime.hift.cfg
    for frames in lengths:
        mel = (torch.randn(1, cfg.in_channels, frames, generator=g) - 4.0).to(runtime.device)

        def draws():
            return draw_source(torch.Generator().manual_seed(frames), frames, 1, cfg.nb_harmonics,
                               graphs.samples_per_frame)

        with torch.inference_mode():
            eager, wave_eager = _timed(lambda: runtime.hift.inference(mel, draws=draws()), sync, repeats)
            graph, wave_graph = _timed(lambda: graphs(mel, draws()), sync, repeats)
            wave_fp32 = _exact_fp32(lambda: runtime.hift.inference(mel, draws=draws()))
        diff = lambda a, b: float((a.float() - b.float()).abs().max())  # noqa: E731
        out["lengths"][str(frames)] = {
            "eager": eager, "graph": graph,
            "speedup": round(eager["median_ms"] / max(graph["median_ms"], 1e-9), 2),
            "max_abs_diff": diff(wave_eager, wave_graph),
            # the yardstick: how far eager itself moves when TF32 is off (the source's phase is a running sum of
            # F0 over every sample, so a rounding difference in the F0 predictor grows along the piece)
            "eager_vs_fp32_max_abs_diff": diff(wave_eager, wave_fp32),
            "graph_vs_fp32_max_abs_diff": diff(wave_graph, wave_fp32),
            "wave_abs_max": float(wave_fp32.float().abs().max())}
    out["replays"], out["eager_calls"] = graphs.replays, graphs.eager
    return out


def flow_section(runtime, rows_list: list[int], frames: int, repeats: int, sync) -> dict:
    import torch

    solver = runtime._flow_solver()
    flow = runtime.models.flow
    steps, spk_dim = flow.cfg.timesteps, flow.spk_embed_affine_layer.out_features
    padded = -(-frames // solver.bucket) * solver.bucket
    g = torch.Generator().manual_seed(1)
    top = max(rows_list)
    mu = torch.randn(top, 80, padded, generator=g).to(runtime.device)
    cond = torch.randn(top, 80, padded, generator=g).to(runtime.device)
    spks = torch.randn(top, spk_dim, generator=g).to(runtime.device)
    mask = torch.ones(top, 1, padded, device=runtime.device)
    mask[1:, :, frames // 2:] = 0  # the other rows shorter: padding inside a row, as sessions' pieces differ
    out = {"frames": frames, "padded": padded, "steps": steps, "rows": {}}
    alone = None
    for rows in rows_list:
        sync()
        t0 = time.perf_counter()
        solver.prepare(padded, steps, spk_dim, rows=(rows,))
        sync()
        capture_s = time.perf_counter() - t0
        with torch.inference_mode():
            stats, x = _timed(lambda: solver.solve_rows(mu[:rows], mask[:rows], spks[:rows], cond[:rows], steps), sync,
                              repeats)
        if rows == 1:
            alone = x
        row = {**stats, "capture_s": round(capture_s, 2), "ms_per_row": round(stats["median_ms"] / rows, 3)}
        if alone is not None:
            row["row0_max_abs_diff_vs_alone"] = float((x[:1].float() - alone.float()).abs().max())
        out["rows"][str(rows)] = row
    base = out["rows"].get("1")
    if base:
        for row in out["rows"].values():
            row["throughput_vs_1_row"] = round(base["median_ms"] / max(row["ms_per_row"], 1e-9), 2)
    out["graphs"] = len(solver.graphs)
    return out


def _cuda_kernels(fn, device) -> int | None:
    """GPU kernels fn() launches when run uncaptured (what a CUDA graph of it replays one after another); None off
    CUDA."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return None
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def flow_kernels_section(runtime, frames_list: list[int], rows_list: list[int], repeats: int, sync) -> dict:
    """The flow solve with fewer kernels (engines/cosyvoice/flow_kernels.py): the serving solver's estimator as it is
    ("plain"), with q/k/v fused, and fused + its blocks compiled; each variant a FastCFM of its own (graphs on CUDA),
    per padded length and row count: median time, kernels per solve, and the largest difference from plain's."""
    import torch

    from digital_human.engines.cosyvoice.flow import FastCFM, solve_ode

    flow = runtime.models.flow
    steps, spk_dim = flow.cfg.timesteps, flow.spk_embed_affine_layer.out_features
    cuda = runtime.device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    variants = {"plain": {}, "fused": {"fused": True}, "fused_compiled": {"fused": True, "compiled": True}}
    g = torch.Generator().manual_seed(1)
    top, longest = max(rows_list), -(-max(frames_list) // 64) * 64  # FastCFM's default bucket: 64 frames
    base = {"mu": torch.randn(top, 80, longest, generator=g), "cond": torch.randn(top, 80, longest, generator=g),
            "spks": torch.randn(top, spk_dim, generator=g), "mask": torch.ones(top, 1, longest)}
    base = {k: v.to(runtime.device) for k, v in base.items()}
    out: dict = {"steps": steps, "dtype": str(dtype), "variants": {}}
    results: dict = {}
    for name, options in variants.items():
        solver = FastCFM(flow.decoder, dtype, **options)
        entry: dict = {"lengths": {}}
        for frames in frames_list:
            padded = -(-frames // solver.bucket) * solver.bucket
            for rows in rows_list:
                inputs = {k: (v[:rows, :, :padded] if v.dim() == 3 else v[:rows]) for k, v in base.items()}
                inputs["mask"] = inputs["mask"].clone()
                inputs["mask"][1:, :, frames // 2:] = 0  # the other rows shorter, as sessions' pieces differ
                sync()
                t0 = time.perf_counter()
                solver.prepare(padded, steps, spk_dim, rows=(rows,))  # compiles (first call) and captures
                sync()
                prepare_s = time.perf_counter() - t0
                with torch.inference_mode():
                    stats, x = _timed(lambda: solver.solve_rows(inputs["mu"], inputs["mask"], inputs["spks"],
                                                                inputs["cond"], steps), sync, repeats)
                key = f"{padded}x{rows}"
                x0 = solver._noise(rows, padded, inputs["mu"])
                kernels = _cuda_kernels(lambda: solve_ode(solver.estimator, x0, inputs["mu"], inputs["mask"],
                                                          inputs["spks"], inputs["cond"], steps, solver.cfg_rate),
                                        runtime.device)
                row = {**stats, "prepare_s": round(prepare_s, 2), "kernels": kernels}
                results[(name, key)] = x
                if name != "plain":
                    ref = results[("plain", key)].float()
                    row["max_abs_diff_vs_plain"] = float((x.float() - ref).abs().max())
                    row["plain_abs_max"] = float(ref.abs().max())
                    row["speedup_vs_plain"] = round(out["variants"]["plain"]["lengths"][key]["median_ms"]
                                                    / max(stats["median_ms"], 1e-9), 3)
                entry["lengths"][key] = row
        entry["compile_note"] = solver.compile_note
        entry["reserved_mib"] = round(torch.cuda.memory_reserved(runtime.device) / 2 ** 20, 1) if cuda else None
        out["variants"][name] = entry
        print(json.dumps({name: {k: {"median_ms": v["median_ms"], "kernels": v["kernels"]}
                                 for k, v in entry["lengths"].items()}}), flush=True)
    return out


def encoder_section(runtime, token_counts: list[int], repeats: int, sync) -> dict:
    """The flow's token encoder for a piece of `token_counts` tokens (prompt + speech so far): eager (flow.encode, as
    served by default) against flow_encoder.FastEncoder (replayed from its CUDA graph per padded length; the padded
    call eagerly off CUDA): median time, GPU kernels of the eager call, and the largest difference."""
    import torch

    from digital_human.engines.cosyvoice.flow_encoder import FastEncoder

    flow = runtime.models.flow
    encoder = FastEncoder(flow)
    sync()
    t0 = time.perf_counter()
    graphs = encoder.prepare(max(token_counts))
    sync()
    out: dict = {"graphs": graphs, "prepare_s": round(time.perf_counter() - t0, 2), "bucket": encoder.bucket,
                 "tokens": {}}
    g = torch.Generator().manual_seed(2)
    for count in token_counts:
        tokens = torch.randint(0, flow.input_embedding.num_embeddings, (1, count), generator=g).to(runtime.device)
        with torch.inference_mode():
            eager, want = _timed(lambda: flow.encode(tokens), sync, repeats)
            graph, got = _timed(lambda: encoder(tokens), sync, repeats)
            kernels = _cuda_kernels(lambda: flow.encode(tokens), runtime.device)
        out["tokens"][str(count)] = {"eager": eager, "graph": graph, "eager_kernels": kernels,
                                     "speedup": round(eager["median_ms"] / max(graph["median_ms"], 1e-9), 2),
                                     "max_abs_diff": float((got - want).abs().max()),
                                     "mu_abs_max": float(want.abs().max())}
    return out


def lm_section(runtime, rows_list: list[int], steps: int, sync) -> dict:
    """The LM's decode step alone (the fast path's StaticDecoder, one generation) against the batched step
    (lm_batch.BatchedDecoder) with 1..N rows active: ms a step, tokens a second, and whether each row drew the
    tokens the single decoder draws for the same seed and prompt (equal to rounding: a product over several rows)."""
    import torch

    from digital_human.engines.cosyvoice.lm_batch import BatchedDecoder

    decoder = runtime._lm_decoder()
    lm = runtime.models.lm
    hidden = lm.llm_embedding.weight.shape[1]
    top = max(rows_list)
    g = torch.Generator().manual_seed(3)
    prompts = [(0.02 * torch.randn(1, 40 + 7 * r, hidden, generator=g)).to(runtime.device, decoder.dtype)
               for r in range(top)]
    banned = lm.min_len_banned(True)

    def single_tokens(k: int) -> tuple[list[int], float]:
        with torch.inference_mode():
            decoder.begin(prompts[k], torch.Generator().manual_seed(k), steps + 1, banned)
            sync()
            t0 = time.perf_counter()
            decoder.advance(steps)
            sync()
            return decoder.drawn[:steps + 1].tolist(), 1000 * (time.perf_counter() - t0) / steps

    alone = [single_tokens(k) for k in range(top)]
    out = {"steps": steps, "single_ms_per_step": round(statistics.median(ms for _, ms in alone), 4), "rows": {}}
    with torch.inference_mode():
        batch = BatchedDecoder(decoder, top, compile=bool(runtime.fast and runtime.fast.lm_compile))
        sync()
        t0 = time.perf_counter()
        out["graph"] = batch.capture()
        sync()
        out["capture_s"] = round(time.perf_counter() - t0, 2)
        for r in range(top):  # warm-up, untimed (first calls' one-off costs); the rows are admitted again below
            batch.admit(r, prompts[r], r, steps + 1, banned)
        for _ in range(4):
            batch.step(top)
        for rows in rows_list:
            for r in range(top):
                batch.release(r)
            for r in range(rows):
                seed = int(torch.randint(0, 2 ** 62, (1,), generator=torch.Generator().manual_seed(r)))
                batch.admit(r, prompts[r], seed, steps + 1, banned)
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                batch.step(rows)
            sync()
            ms = 1000 * (time.perf_counter() - t0) / steps
            drawn = batch.drawn[:rows, :steps + 1].tolist()
            same = [drawn[r] == alone[r][0] for r in range(rows)]
            out["rows"][str(rows)] = {"ms_per_step": round(ms, 4), "tokens_per_s": round(1000 * rows / ms, 1),
                                      "vs_single_tokens_per_s": round(out["single_ms_per_step"] * rows / ms, 2),
                                      "rows_with_the_single_decoders_tokens": sum(same)}
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", required=True, help="folder for the random-weight release (kept between runs)")
    parser.add_argument("--size", choices=("full", "reduced"), default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", default="16,24,40,72,108,114", help="HiFT mel lengths (live pieces: the "
                        "first 16, then 8 frames of context + 2 a token: 24, 40, 72, 108; 114 the longest)")
    parser.add_argument("--rows", default="1,2,4,8", help="flow solve row counts (--tts-batch's sizes)")
    parser.add_argument("--flow-frames", type=int, default=400, help="a piece's flow length (prompt + tokens so "
                        "far, 2 frames a token)")
    parser.add_argument("--sections", default="hift,flow,lm", help="any of hift, flow, lm, flow_kernels, encoder")
    parser.add_argument("--encoder-tokens", default="86,160,300", help="encoder: tokens of a piece (a 3-s prompt's 75 "
                        "+ a first piece's 11; later pieces)")
    parser.add_argument("--kernel-frames", default="192,448", help="flow_kernels: padded piece lengths (a first "
                        "piece with a 3-s prompt pads to 192 frames)")
    parser.add_argument("--lm-steps", type=int, default=64, help="decode steps timed per row count (lm section)")
    parser.add_argument("--commit", default=os.environ.get("DH_COMMIT", ""))
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    report = {"benchmark": "gpu_tts_pieces", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": args.commit, "size": args.size, "device": args.device,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count()}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runtime = build_runtime(args.size, args.device, work / f"cosyvoice2_{args.size}")
    sections = set(args.sections.split(","))
    if "hift" in sections:
        report["hift"] = hift_section(runtime, [int(v) for v in args.lengths.split(",")], args.repeats, sync)
        print(json.dumps({"hift": {k: v for k, v in report["hift"].items() if k != "lengths"}}), flush=True)
    if "flow" in sections:
        report["flow"] = flow_section(runtime, [int(v) for v in args.rows.split(",")], args.flow_frames, args.repeats,
                                      sync)
    if "flow_kernels" in sections:
        report["flow_kernels"] = flow_kernels_section(runtime, [int(v) for v in args.kernel_frames.split(",")],
                                                      [int(v) for v in args.rows.split(",")], args.repeats, sync)
    if "encoder" in sections:
        report["encoder"] = encoder_section(runtime, [int(v) for v in args.encoder_tokens.split(",")], args.repeats,
                                            sync)
        print(json.dumps({"encoder": report["encoder"]}), flush=True)
    if "lm" in sections:
        report["lm"] = lm_section(runtime, [int(v) for v in args.rows.split(",")], args.lm_steps, sync)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
