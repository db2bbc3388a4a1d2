#!/usr/bin/env python3
"""Turns shoal-bench-micro's JSON (Google Benchmark, with repetitions) into
the bench table and the `micro: ... ratio=...` line. Figures are medians of
the repetitions, in GB/s, each also as a ratio against memcpy of the same
bytes measured in the same run.

ratio = throughput of the chunk codec (EncodeChunk then ChunkReceiver::Accept
on the same 1 MiB chunk) / throughput of memcpy: how many copies' worth of
time the codec costs, inverted (0.5 = as slow as two copies).
"""
import json
import os
import sys


def main():
    path = sys.argv[1]
    with open(path) as f:
        data = json.load(f)
    reps = None
    median = {}
    times = {}  # ns per iteration (CPU time), for benchmarks without bytes
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        if "bytes_per_second" in b:
            median[name] = b["bytes_per_second"] / 1e9
        unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        times[name] = b["cpu_time"] * unit
        reps = b.get("repetitions", reps)
    memcpy = median["BM_Memcpy/1048576"]
    rows = [
        ("memcpy 1 MiB", "BM_Memcpy/1048576", "baseline"),
        ("CRC-32C 1 MiB (common/crc32c, 3 lanes)", "BM_Crc32c/1048576", ""),
        ("CRC-32C 64 KiB (common/crc32c, 3 lanes)", "BM_Crc32c/65536", ""),
        ("CRC-32C 1 MiB, one lane (before)", "BM_Crc32cOneLane/1048576", ""),
        ("EncodeChunk 1 MiB", "BM_EncodeChunk", "copy + CRC (protobuf form)"),
        ("ChunkReceiver::Accept 1 MiB", "BM_ChunkReceiverAccept", "checks + CRC"),
        ("encode+serialize+parse+accept+copy", "BM_ChunkRoundTripProtobuf",
         "user-space work of one chunk, protobuf form"),
        ("zero-copy: header+parse+check+copy", "BM_ChunkRoundTripZeroCopy",
         "user-space work of one chunk as the worker does it"),
        ("average: add (loop before, -O2)", "BM_AverageAddScalar", "scalar: may alias"),
        ("average: add (AddFloats)", "BM_AverageAddVector", "__restrict, vectorized"),
        ("average: scale (loop before, -O2)", "BM_AverageScaleScalar/1", "scalar divss"),
        ("average: scale (DivideFloats)", "BM_AverageScaleVector/1", "divps, same bits"),
        ("owner: mean of 5 x 1 MiB", "BM_CombineContributions/rule:0/n:5",
         "CombineContributions, bytes read"),
        ("owner: trimmed_mean:1 of 5 x 1 MiB", "BM_CombineContributions/rule:1/n:5",
         "sort 5 per element"),
        ("owner: median of 5 x 1 MiB", "BM_CombineContributions/rule:2/n:5", ""),
        ("owner: trimmed_mean:1 of 16 x 1 MiB", "BM_CombineContributions/rule:1/n:16", ""),
        ("owner: median of 16 x 1 MiB", "BM_CombineContributions/rule:2/n:16", ""),
        ("SHA-256 4 MiB", "BM_Sha256/4194304", "OpenSSL"),
    ]
    width = max(len(r[0]) for r in rows)
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"== micro: Google Benchmark, median of {reps} repetitions, GB/s  "
          f"(cores={cores}, load1={load:.2f} at the end)")
    print(f"{'figure':<{width}}  {'GB/s':>7}  {'vs memcpy':>9}  note")
    for label, key, note in rows:
        if key not in median:
            continue
        v = median[key]
        print(f"{label:<{width}}  {v:7.2f}  {v / memcpy:9.3f}  {note}")
    plans = [("plan copy+destroy, 10 workers", "BM_PlanCopyAndDestroy/10"),
             ("plan copy+destroy, 1000 workers", "BM_PlanCopyAndDestroy/1000"),
             ("plan serialize, 10 workers", "BM_PlanSerialize/10"),
             ("plan serialize, 1000 workers", "BM_PlanSerialize/1000")]
    if all(k in times for _, k in plans):
        print(f"{'coordinator, per recipient of a plan':<{width}}  {'us':>7}")
        for label, key in plans:
            print(f"{label:<{width}}  {times[key] / 1e3:7.2f}")
    encode = median["BM_EncodeChunk"]
    accept = median["BM_ChunkReceiverAccept"]
    codec = 1.0 / (1.0 / encode + 1.0 / accept)  # both steps on the same bytes
    print(f"micro: memcpy_GBps={memcpy:.1f} crc32c_GBps={median['BM_Crc32c/1048576']:.1f} "
          f"crc32c_1lane_GBps={median.get('BM_Crc32cOneLane/1048576', 0):.1f} "
          f"codec_GBps={codec:.2f} roundtrip_GBps={median['BM_ChunkRoundTripProtobuf']:.2f} "
          f"zerocopy_GBps={median['BM_ChunkRoundTripZeroCopy']:.2f} "
          f"add_GBps={median['BM_AverageAddVector']:.1f} "
          f"scale_GBps={median['BM_AverageScaleVector/1']:.1f} "
          f"sha256_GBps={median['BM_Sha256/4194304']:.2f} reps={reps} cores={cores} "
          f"ratio={codec / memcpy:.3f}")


if __name__ == "__main__":
    main()
