#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<harness>/: a few small valid inputs per parser,
from which libFuzzer's mutations start. Run from anywhere; rewrites the seed files."""
import gzip
import json
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(harness, name, data):
    folder = os.path.join(ROOT, harness)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def s(text):
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<I", len(data)) + data


# TCP store requests (tcp_wire.h): opcode, then fields.
write("tcp_request_fuzz", "hello", b"\x01" + struct.pack("<IB", 0x4F4C4F4B, 2) + s("job-token"))
write("tcp_request_fuzz", "set", b"\x02" + s("rank/0") + s(b"\x00\x01value"))
write("tcp_request_fuzz", "get", b"\x03" + s("rank/0") + struct.pack("<Q", 1000))
write("tcp_request_fuzz", "wait", b"\x04" + struct.pack("<I", 2) + s("a") + s("b") + struct.pack("<Q", 5))
write("tcp_request_fuzz", "add", b"\x05" + s("counter") + struct.pack("<q", -3))
write("tcp_request_fuzz", "remove", b"\x06" + s("a"))
write("tcp_request_fuzz", "check", b"\x07" + struct.pack("<I", 1) + s("a"))
write("tcp_request_fuzz", "multi_get", b"\x08" + struct.pack("<I", 2) + s("a") + s("b") + struct.pack("<Q", 5))
write("tcp_request_fuzz", "multi_set", b"\x09" + struct.pack("<I", 2) + s("a") + s(b"1") + s("b") + s(b""))
write("tcp_request_fuzz", "compare_set", b"\x0a" + s("a") + s(b"") + s(b"new"))
write("tcp_request_fuzz", "arrive", b"\x0b" + s("barrier") + struct.pack("<QQQ", 16384, 1, 60000))
write("tcp_request_fuzz", "arrive_many", b"\x0b" + s("barrier") + struct.pack("<QQQ", 16384, 256, 60000))
write("tcp_request_fuzz", "check_each", b"\x0c" + struct.pack("<I", 2) + s("a") + s("b"))
write("tcp_request_fuzz", "get_available", b"\x0d" + struct.pack("<I", 2) + s("a") + s("b") + struct.pack("<Q", 30000))

# TCP store replies: the request's opcode, then the reply body (status first).
write("tcp_reply_fuzz", "hello_ok", b"\x01\x00")
write("tcp_reply_fuzz", "get_ok", b"\x03\x00" + s(b"value"))
write("tcp_reply_fuzz", "get_timeout", b"\x03\x01" + struct.pack("<I", 1) + s("rank/1"))
write("tcp_reply_fuzz", "wait_timeout", b"\x04\x01" + struct.pack("<I", 2) + s("a") + s("b"))
write("tcp_reply_fuzz", "add_ok", b"\x05\x00" + struct.pack("<q", 42))
write("tcp_reply_fuzz", "add_error", b"\x05\x02" + s("not an integer"))
write("tcp_reply_fuzz", "check_ok", b"\x07\x00\x01")
write("tcp_reply_fuzz", "multi_get_ok", b"\x08\x00" + struct.pack("<I", 2) + s(b"x") + s(b""))
write("tcp_reply_fuzz", "multi_get_timeout", b"\x08\x01" + struct.pack("<I", 1) + s("b"))
write("tcp_reply_fuzz", "compare_set_ok", b"\x0a\x00" + s(b"new"))
write("tcp_reply_fuzz", "arrive_ok", b"\x0b\x00" + struct.pack("<q", 7))
write("tcp_reply_fuzz", "check_each_ok", b"\x0c\x00" + struct.pack("<I", 3) + b"\x01\x00\x01")
write("tcp_reply_fuzz", "get_available_ok", b"\x0d\x00" + struct.pack("<I", 3) + b"\x01" + s(b"x") + b"\x00\x01" + s(b""))

# Native frame headers (frame.h): 64 bytes.
def frame(kind, collective, dtype, op, algorithm, context, root, tag, seq, count, length):
    return struct.pack("<IBBBBB3xIiiQQQ16x", 0x4B4F4C4F, kind, collective, dtype, op,
                       algorithm, context, root, tag, seq, count, length)

write("frame_header_fuzz", "allreduce", frame(1, 1, 0, 0, 1, 0, -1, 0, 7, 1000, 4000))
write("frame_header_fuzz", "broadcast", frame(1, 3, 1, 0, 0, 2, 3, 0, 1, 5, 40))
write("frame_header_fuzz", "p2p", frame(2, 0, 6, 0, 0, 0, -1, 9, 0, 16, 16))


# Safetensors files: u64 header length, JSON header, data.
def safetensors(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data

write("safetensors_fuzz", "two", safetensors({
    "__metadata__": {"step": "3"},
    "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]}}, bytes(range(20))))
write("safetensors_fuzz", "empty_tensor", safetensors({
    "e": {"dtype": "I64", "shape": [0, 3], "data_offsets": [0, 0]},
    "x": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}, b"abc"))

# IDX files: magic 0 0 8 ndim, big-endian dimensions, bytes.
def idx(dims, values):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)

write("idx_fuzz", "labels", idx([3], [1, 2, 3]))
write("idx_fuzz", "images", idx([2, 2, 2], range(8)))
write("idx_fuzz", "images_gz", gzip.compress(idx([2, 3], range(6)), mtime=0))


# Checkpoint manifests: mode byte (0: as is, 1: the harness fixes the checksum), JSON.
def manifest_text():
    m = {"format": "kolo-checkpoint-1", "step": 12, "epoch": 1,
         "loader": {"epoch": 1, "batch": 2}, "rng": [1, 2, 3, 4], "extra": {"model": "mlp"},
         "optimizer": {"kind": "adam", "scalars": {"step": 12}},
         "files": {"model.safetensors": {"bytes": 100, "crc32": 12345},
                   "optimizer.safetensors": {"bytes": 200, "crc32": 67890}}}
    canonical = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    m["manifest_crc32"] = zlib.crc32(canonical)
    return json.dumps(m, indent=2).encode()

write("manifest_fuzz", "valid", b"\x00" + manifest_text())
write("manifest_fuzz", "valid_fixup", b"\x01" + manifest_text())

# Store counters: i64 delta, then the stored decimal text.
write("store_counter_fuzz", "positive", struct.pack("<q", 5) + b"123")
write("store_counter_fuzz", "negative", struct.pack("<q", -1) + b"-9000")
write("store_counter_fuzz", "empty", struct.pack("<q", 7))

# Native rendezvous records (rank_record.h): mode byte (even: a rank's record, 1 mod 4: the
# host segment record, 3 mod 4: the host table after a byte of rank count - 1), then the text.
write("rank_record_fuzz", "one_address", b"\x00" + b"node0/3f2a-boot/4026531840\n4242\n40123\n"
      b"140737488346112\n9876543210\n0,1,2,3\n10.0.0.5\n")
write("rank_record_fuzz", "many_addresses", b"\x00" + b"h/b/1\n7\n65535\n0\n18446744073709551615\n"
      b"5\n192.168.1.2\nfd00::7\n127.0.0.1\n::1\n")
write("rank_record_fuzz", "no_cpus", b"\x02" + b"h\n1\n1\n1\n1\n\n127.0.0.1\n")
write("rank_record_fuzz", "segment", b"\x01" + b"4242 17")
write("rank_record_fuzz", "segment_error", b"\x01" + b"error 4 local ranks need 9 MiB of shared memory")
write("rank_record_fuzz", "host_table", b"\x03" + bytes([11]) + struct.pack("<6I", 4, 0, 2, 4, 0, 1))


# Parameter-server wire (wire.h): a mode byte (0: a server reads, 1: the chief's dispatcher,
# 2: a worker), then the peer's bytes: 40-byte headers, each followed by its payload.
def ps_header(op, a=0, b=0, payload=0, index=0, flags=0):
    return struct.pack("<IIIIqqQ", 0x3153504B, op, index, flags, a, b, payload)

PS_TOKEN = b"job-token"
ps_hello = ps_header(1, 0, 0, len(PS_TOKEN), index=2) + PS_TOKEN
write("ps_wire_fuzz", "server_session", b"\x00" + ps_hello + ps_header(2)
      + ps_header(3, 5, 0, 16) + bytes(16) + ps_header(5) + ps_header(4) + ps_header(6))
write("ps_wire_fuzz", "server_chief", b"\x00" + ps_header(1, 1, 0, len(PS_TOKEN)) + PS_TOKEN
      + ps_header(8, 0, 0, 19) + b"/ckpt/server-0.safetensors"[:19] + ps_header(10, index=3)
      + ps_header(11, 4242, 17, 8 + 6) + struct.pack("<Q", 99) + b"host-a")
write("ps_wire_fuzz", "chief_units", b"\x01" + ps_hello + ps_header(7, -1, 0, 8)
      + struct.pack("<d", 0.0) + ps_header(7, 0, 3, 8) + struct.pack("<d", 2.5))
write("ps_wire_fuzz", "worker_units", b"\x02" + ps_header(0) + ps_header(0, 4, 1, 16)
      + struct.pack("<qq", 32, 40) + ps_header(2) + ps_header(3)
      + ps_header(1, 0, 0, 12) + b"wrong things")
write("ps_wire_fuzz", "worker_refused", b"\x02" + ps_header(1, 0, 0, 15) + b"wrong job token")

# A parameter server's checkpoint (server_state.h): a safetensors file whose metadata says
# which server wrote it, for which optimizer, at which version and step.
def server_state(meta, tensors):
    header, data = {"__metadata__": meta}, b""
    for name, values in tensors:
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + 4 * len(values)]}
        data += struct.pack("<%df" % len(values), *values)
    return safetensors(header, data)

write("ps_server_state_fuzz", "adam", server_state(
    {"version": "12", "server": "0", "optimizer": "adam", "lr": "0.001", "step": "12"},
    [("value/w", [1, 2, 3]), ("state/w/m", [0.1, 0.2, 0.3]), ("state/w/v", [0.01, 0.02, 0.03])]))
write("ps_server_state_fuzz", "fresh", server_state(
    {"version": "0", "server": "0", "optimizer": "adam", "lr": "0.1", "step": "0"},
    [("value/b[0:2]", [0, 0])]))

# Elastic records (src/parallel/elastic/record.h): a mode byte (0: a generation's members,
# 1: a reported step, 2: a joiner's id), then the text.
write("elastic_record_fuzz", "members", b"\x00" + b"120 0 0 1 3")
write("elastic_record_fuzz", "members_joined", b"\x00" + b"-1 2 0 2 5 7")
write("elastic_record_fuzz", "step", b"\x01" + b"4096")
write("elastic_record_fuzz", "joiner", b"\x02" + b"4")

# kolo report's files: a mode byte (0: a Chrome trace for the step breakdown, 1: a
# flight-recorder dump, 2: a rank's trace to merge, 3: a metrics file), then the file.
def compact(value):
    return json.dumps(value, separators=(",", ":")).encode()

trace_events = [
    {"ph": "X", "name": "step", "cat": "train", "ts": 0, "dur": 100, "pid": 0, "tid": 1},
    {"ph": "X", "name": "data", "cat": "data", "ts": 1, "dur": 9, "pid": 0, "tid": 1},
    {"ph": "X", "name": "forward", "cat": "compute", "ts": 10, "dur": 30, "pid": 0, "tid": 1},
    {"ph": "X", "name": "allreduce", "cat": "comm", "ts": 45, "dur": 50, "pid": 0, "tid": 2},
    {"ph": "X", "name": "wait", "cat": "comm", "ts": 80, "dur": 15, "pid": 0, "tid": 1},
    {"ph": "X", "name": "step", "cat": "train", "ts": 0, "dur": 90, "pid": 1, "tid": 7},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "main"}}]
write("report_fuzz", "trace", b"\x00" + compact({"traceEvents": trace_events}))
write("report_fuzz", "flight", b"\x01" + compact({
    "rank": 0, "world_size": 2, "pid": 4242, "reason": "timeout", "note": "", "dump_ns": 5000,
    "entries": [{"id": 1, "seq": 1, "context": 0, "group_rank": 0, "group_size": 2,
                 "op": "allreduce", "dtype": "f32", "reduce": "sum", "algorithm": "ring",
                 "state": "finished", "count": 10, "bytes": 40, "queued_ns": 1,
                 "started_ns": 2, "finished_ns": 3},
                {"id": 2, "seq": 2, "context": 0, "group_rank": 0, "group_size": 2,
                 "op": "broadcast", "dtype": "f32", "state": "started", "count": 4,
                 "root": 1, "queued_ns": 4, "started_ns": 5}],
    "stacks": [{"tid": 7, "name": "main", "answered": True, "frames": ["main", "train"]}]}))
write("report_fuzz", "rank_trace", b"\x02" + compact(
    {"traceEvents": trace_events[:4], "kolo": {"rank": 0, "dropped": 3}}))
metrics_lines = [
    {"kind": "event", "event": "start", "strategy": "ddp", "ranks": 2, "algorithm": "ring", "batch": 32},
    {"kind": "interval", "step": 10, "step_ms": 12.5, "slowest_rank": 1,
     "ranks": [{"rank": 0, "step_ms": 11}, {"rank": 1, "step_ms": 12.5}]},
    {"epoch": 1, "step": 20, "train_loss": 0.7, "test_accuracy": 0.81, "samples_per_s": 900.5},
    {"kind": "event", "event": "failed", "rank": 1, "signal": "SIGKILL", "wall_s": 3.5},
    {"final": True, "epoch": 2, "step": 40, "train_loss": 0.4, "wall_s": 9.25}]
write("report_fuzz", "metrics", b"\x03" + b"\n".join(compact(m) for m in metrics_lines) + b"\n")

# A rank's output as kolo run reads it from the pipe: a byte setting the size of the reads
# (byte + 1), then the output.
write("line_prefixer_fuzz", "lines", b"\x07" + b"epoch 1 loss 0.5\nepoch 2 loss 0.25\n\nno newline at the end")
write("line_prefixer_fuzz", "long_line", b"\xff" + b"x" * 3000 + b"\n" + b"y" * 10 + b"\n")
# Past LinePrefixer::kMaxLineBytes (64 KiB), so that libFuzzer makes inputs that long.
write("line_prefixer_fuzz", "line_past_the_limit", b"\xff" + b"z" * (64 * 1024 + 100) + b"\n")

# CSV/TSV tables: a byte choosing the name (bit 0: .tsv), the label column (bit 1: "y") and
# given classes (bit 2: a, b, c), then the file.
write("csv_fuzz", "integers", b"\x00" + b"a,b,label\n1.5,-2,0\n3e4,4,2\n")
write("csv_fuzz", "strings_quoted", b"\x02" + b'"x, 1",x2,y\r\n1,2,cat\r\n"3",4,"dog"\r\n\r\n')
write("csv_fuzz", "tsv_classes", b"\x05" + b"label\tf\na\t1\nc\t2\n")


def npy(descr, shape, payload, version=1):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode()
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + payload


# NumPy arrays (every supported dtype) and .npz archives, stored and deflated.
write("npy_fuzz", "f4", npy("<f4", "(2, 3)", struct.pack("<6f", *range(6))))
write("npy_fuzz", "u1_v2", npy("|u1", "(4,)", bytes([1, 2, 3, 4]), version=2))
write("npy_fuzz", "i8", npy("<i8", "(3,)", struct.pack("<3q", 0, 1, 2)))
write("npy_fuzz", "f8_scalar", npy("<f8", "()", struct.pack("<d", 0.5)))


def npz(members, method):
    import io
    import zipfile
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(name + ".npy", data)
    return buffer.getvalue()


members = [("x", npy("<f4", "(2, 2)", struct.pack("<4f", 1, 2, 3, 4))), ("y", npy("<i8", "(2,)", struct.pack("<2q", 0, 1)))]
write("npy_fuzz", "stored_npz", npz(members, 0))
write("npy_fuzz", "deflated_npz", npz(members, 8))


def png(width, height, colour, rows):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# Images: PNG grey and RGB (written here), and a small JPEG when PIL is there to encode it.
write("image_fuzz", "grey.png", png(3, 2, 0, [bytes([0, 128, 255]), bytes([1, 2, 3])]))
write("image_fuzz", "rgb.png", png(2, 2, 2, [bytes(range(6)), bytes(range(6, 12))]))
try:
    import io
    from PIL import Image
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 90)).save(buffer, format="JPEG", quality=80)
    write("image_fuzz", "rgb.jpg", buffer.getvalue())
except ImportError:
    pass
