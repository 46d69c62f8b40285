"""The offline GPU bundle (planner, lock, repack, receive), the gpu-vllm profile as the GPU script
starts it, the per-request routing policy, and the GPU benchmark's figures (no GPU, no server)."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest

from build_scripts import gpu_bundle, gpu_offline
from build_scripts.gpu_bundle import BundleError, Chunk, plan_folders, read_lock, repack_wheel, wheel_installable
from hybrid_llm.router.config import RouterConfig
from hybrid_llm.contracts.spec import InvalidInput
from hybrid_llm.router.job import requested_policy
from loadtests import gpu_bench

MIB = 2**20


# ---------------------------------------------------------------- planner


@pytest.mark.parametrize("sizes", [[("stub", 5 * MIB), ("runtime", 70 * MIB), ("wheels", 1), ("vllm", 130 * MIB)],
                                   [("a", 0), ("b", 60 * MIB)], [("only", 10)]])
def test_every_folder_fits_and_the_chunks_rebuild_each_group_in_order(sizes):
    limit = 60 * MIB
    plan = plan_folders(sizes, limit)
    for folder in plan:
        assert sum(c.length for c in folder) <= limit - 64 * 1024
    chunks = [c for folder in plan for c in folder]
    for group, size in sizes:
        mine = [c for c in chunks if c.group == group]
        assert [c.index for c in mine] == list(range(len(mine)))
        assert sum(c.length for c in mine) == size
        assert all(a.offset + a.length == b.offset for a, b in zip(mine, mine[1:]))
    order = [g for g, _ in sizes]
    assert [order.index(c.group) for c in chunks] == sorted(order.index(c.group) for c in chunks)


def test_a_limit_without_room_is_refused():
    with pytest.raises(BundleError, match="no room"):
        plan_folders([("a", 10)], 1000)


def test_split_and_receive_round_trip(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    archives = []
    rng = random.Random(0)
    payloads = {"stub": rng.randbytes(300_000), "vllm": rng.randbytes(150_000)}
    for name, payload in payloads.items():
        (src / f"{name}.bin").write_bytes(payload)
        archives.append(gpu_bundle.write_group(name, {"x.bin": src / f"{name}.bin"}, tmp_path, preset=0))
    folders = gpu_bundle.split_into_folders(archives, tmp_path / "parts", limit=200_000)
    assert len(folders) >= 2
    assert all(sum(p.stat().st_size for p in f.iterdir()) <= 200_000 for f in folders)
    staging = tmp_path / "staging"
    # The last folder alone completes nothing; all of them unpack both groups, checked by hash.
    assert gpu_offline.receive(folders[-1:], staging) == []
    assert sorted(gpu_offline.receive(folders, staging)) == ["stub", "vllm"]
    assert (staging / "stub" / "x.bin").read_bytes() == payloads["stub"]
    assert (staging / "vllm" / "x.bin").read_bytes() == payloads["vllm"]
    assert gpu_offline.receive(folders, staging) == []  # done once


def test_a_corrupt_chunk_is_refused(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a" * 1000)
    archive = gpu_bundle.write_group("stub", {"a.bin": tmp_path / "a.bin"}, tmp_path, preset=0)
    folders = gpu_bundle.split_into_folders([archive], tmp_path / "parts", limit=100_000)
    chunk = next(p for p in folders[0].iterdir() if p.name != gpu_bundle.MANIFEST)
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="sha256"):
        gpu_offline.receive(folders, tmp_path / "staging")


# ---------------------------------------------------------------- lock and wheels


def test_the_lock_has_one_version_per_package_and_installs_on_cp312():
    pins = read_lock()
    names = [gpu_bundle.canonical(p.name) for p in pins]
    assert len(names) == len(set(names))
    assert "vllm" in names and "tritonclient" in names
    assert gpu_bundle.check_lock(pins) == []


def test_a_package_pinned_twice_is_refused(tmp_path):
    h = "0" * 64
    lock = tmp_path / "lock.txt"
    lock.write_text(f"foo==1.0 --hash=sha256:{h}  # foo-1.0-py3-none-any.whl\n"
                    f"Foo==2.0 --hash=sha256:{h}  # Foo-2.0-py3-none-any.whl\n")
    with pytest.raises(BundleError, match="pinned twice"):
        read_lock(lock)
    lock.write_text("foo==1.0\n")
    with pytest.raises(BundleError, match="expected"):
        read_lock(lock)


@pytest.mark.parametrize("filename, ok", [
    ("vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", True),
    ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
    ("sniffio-1.3.1-py3-none-any.whl", True),
    ("numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl", False),
    ("foo-1.0-cp312-cp312-macosx_11_0_arm64.whl", False),
    ("foo-1.0-cp312-cp312-manylinux_2_17_aarch64.whl", False),
    ("foo-1.0-cp313-abi3-manylinux_2_17_x86_64.whl", False),
])
def test_wheel_tags(filename, ok):
    assert wheel_installable(filename) is ok


def test_repack_drops_members_and_their_record_lines(tmp_path):
    src, dst = tmp_path / "vllm-1-cp38-abi3-x.whl", tmp_path / "out.whl"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", "x = 1\n")
        z.writestr("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", b"\0" * 100)
        z.writestr("vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so", b"\0")
        z.writestr("vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", b"\0")
        z.writestr("vllm-1.dist-info/RECORD", "vllm/__init__.py,,\nvllm/vllm_flash_attn/_vllm_fa2_C.abi3.so,,\n"
                   "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so,,\n")
    dropped = repack_wheel(src, dst, gpu_bundle.VLLM_DROP)
    assert sorted(dropped) == ["vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
                               "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    with zipfile.ZipFile(dst) as z:
        assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" in z.namelist()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        assert z.read("vllm-1.dist-info/RECORD").decode() == "vllm/__init__.py,,\n"


# ---------------------------------------------------------------- the gpu-vllm profile as started


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu") / "repository"
    original = gpu_offline.REPO
    gpu_offline.REPO = repo
    try:
        return gpu_offline.render_repo([])
    finally:
        gpu_offline.REPO = original


def _params(config_text: str) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in config.parameters.items()}, config


def test_gpu_vllm_engines_share_one_gpu_and_use_the_bundle_model(gpu_repo):
    shares = 0.0
    for model in ("vllm_backend", "trtllm"):
        params, config = _params((gpu_repo / model / "config.pbtxt").read_text())
        assert params["device"] == "cuda" and config.backend == "python"
        assert config.instance_group[0].kind == config.instance_group[0].KIND_MODEL
        args = json.loads((gpu_repo / model / "1" / "model.json").read_text())
        assert args["model"] == str(gpu_offline.MODEL) and args["block_size"] == 16
        shares += args["gpu_memory_utilization"]
    assert shares <= 0.9  # both engines' KV pools plus CUDA graphs and the router on one GPU
    router, _ = _params((gpu_repo / "router_bls" / "config.pbtxt").read_text())
    assert router["tokenizer_dir"] == str(gpu_offline.MODEL)


def test_gpu_server_command_uses_the_bundle_runtime_and_loads_engines_one_at_a_time(gpu_repo, tmp_path,
                                                                                   monkeypatch):
    runtime = tmp_path / "tritonserver"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "bin" / "tritonserver").write_text("")
    monkeypatch.setattr(gpu_offline, "RUNTIME", runtime)
    cmd = gpu_offline.make_server(gpu_repo, [8000, 8001, 8002]).command()
    assert cmd[0] == str(runtime / "bin" / "tritonserver")
    assert f"--backend-directory={runtime / 'backends'}" in cmd
    assert {"--allow-gpu-metrics=true", "--model-control-mode=explicit", "--load-model=*",
            "--model-load-thread-count=1"} <= set(cmd)


def test_peer_vllm_serve_gets_vllm_backends_engine_args(gpu_repo):
    cmd = gpu_offline.peer_command(gpu_repo, port=8100)
    args = json.loads((gpu_repo / "vllm_backend" / "1" / "model.json").read_text())
    assert cmd[cmd.index("serve") + 1] == args["model"]
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            assert (flag if value else "--no-" + flag[2:]) in cmd
        else:
            assert cmd[cmd.index(flag) + 1] == str(value)


# ---------------------------------------------------------------- per-request policy


def test_routing_policy_parameter():
    assert requested_policy({}, RouterConfig()) is None
    with pytest.raises(InvalidInput, match="policy_override is false"):
        requested_policy({"routing_policy": "round_robin"}, RouterConfig())
    with pytest.raises(InvalidInput, match="send one of"):
        requested_policy({"routing_policy": "fastest"}, RouterConfig(policy_override=True))
    assert requested_policy({"routing_policy": "trtllm_only"}, RouterConfig(policy_override=True)) == "trtllm_only"


# ---------------------------------------------------------------- benchmark figures


def test_streams_are_split_evenly():
    assert gpu_bench.split_streams(1, 8) == [1]
    assert gpu_bench.split_streams(16, 8) == [2] * 8
    assert gpu_bench.split_streams(10, 4) == [3, 3, 2, 2]


@pytest.mark.parametrize("pin, expected", [(True, {"routing_policy": "vllm_only"}), (False, None)])
def test_p1_router_requests_name_vllm_only_when_pinned(monkeypatch, pin, expected):
    sent = []
    monkeypatch.setattr(gpu_bench, "send", lambda url, model, sample, contract, tok, timeout_s, parameters=None:
                        sent.append((model, contract, parameters)))
    router, direct = gpu_bench.p1_targets("127.0.0.1:8001", pin)
    router.send(None, 1.0)
    direct.send(None, 1.0)
    assert sent == [("router_bls", "router", expected), ("vllm_backend", "vllm", None)]


def test_gpu_gauges_are_summed_over_devices():
    page = ('# HELP nv_gpu_utilization x\nnv_gpu_utilization{gpu_uuid="a"} 0.5\n'
            'nv_gpu_utilization{gpu_uuid="b"} 0.25\nnv_gpu_power_usage{gpu_uuid="a"} 300\nother 1\n')
    assert gpu_bench.parse_gauges(page, gpu_bench.GPU_METRICS) == {"nv_gpu_utilization": 0.75,
                                                                   "nv_gpu_power_usage": 300.0}


def _rec(ttft, tokens=10, error=None):
    return {"ttft_s": ttft, "output_tokens": tokens, "error": error}


def test_level_figures_and_the_ratio_table(tmp_path):
    a = gpu_bench.WorkerResult([_rec(0.010), _rec(0.020)], [0.001, 0.002], 2.0)
    b = gpu_bench.WorkerResult([_rec(0.030), _rec(None, 0, "boom")], [0.003], 1.0)
    fig = gpu_bench.level_figures([a, b])
    assert fig["requests"] == 4 and fig["errors"] == 1 and fig["output_tokens"] == 30
    assert fig["tok_s"] == pytest.approx(15.0) and fig["ttft_p50_ms"] == pytest.approx(20.0)
    assert fig["itl_p50_ms"] == pytest.approx(2.0)
    direct = [dict(fig, tok_s=100.0, ttft_p50_ms=10.0), dict(fig, tok_s=200.0, ttft_p50_ms=12.0)]
    router = [dict(fig, tok_s=90.0, ttft_p50_ms=11.0), dict(fig, tok_s=190.0, ttft_p50_ms=13.0)]
    rows = gpu_bench.closed_loop_rows({"levels": {"64": {"direct": direct, "router": router}}}, "direct", "router")
    assert rows[0][0] == "64" and rows[0][3].startswith("0.93 (0.9-0.95)") and rows[0][6] == "+1.0"
    (tmp_path / "p1.json").write_text(json.dumps({"settings": {}, "levels": {"64": {"direct": direct,
                                                                                   "router": router}}}))
    assert "| 64 |" in gpu_bench.report(tmp_path) and (tmp_path / "results.md").exists()


def test_p2_rows_compare_with_round_robin():
    def rounds(p99, sla):
        return {"rounds": [{"short_ttft_p99_ms": p99, "sla_attainment": sla, "goodput_rps": 10.0,
                            "urgent_ttft_p50_ms": 5.0, "urgent_ttft_p99_ms": 9.0, "long_e2e_p50_ms": 100.0,
                            "tok_s": 1000.0, "errors": 0}]}
    rows = {r[0]: r for r in gpu_bench.p2_rows({"policies": {"hybrid": rounds(50.0, 0.9),
                                                             "round_robin": rounds(200.0, 0.45)}})}
    assert rows["hybrid"][2] == "0.25" and rows["hybrid"][4] == "2.00" and rows["round_robin"][2] == "1.00"


def test_openai_stream_client_times_chunks_and_reads_usage():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["stream"] and body["stream_options"] == {"include_usage": True}
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in ({"choices": [{"text": "he", "finish_reason": None}]},
                          {"choices": [{"text": "llo", "finish_reason": "length"}]},
                          {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}):
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from hybrid_llm.contracts import GenerationRequest

        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = gpu_bench.stream_openai(url, "m", GenerationRequest(prompt="hi", max_tokens=2))
        assert result.error is None and result.text == "hello" and result.finish_reason == "length"
        assert (result.num_input_tokens, result.num_output_tokens) == (7, 2)
        assert result.ttft_s is not None and len(result.chunk_times_s) == 2
    finally:
        server.shutdown()


def test_the_gap_sample_is_uniform_over_the_whole_stream():
    sample = gpu_bench.Reservoir(1000, seed=1)
    sample.extend(range(100_000))
    assert len(sample.items) == 1000 and sample.seen == 100_000
    # Uniform over 0..99999: the mean is near 50,000 and early values survive.
    assert 45_000 < sum(sample.items) / 1000 < 55_000
    assert sum(1 for v in sample.items if v < 10_000) > 50
