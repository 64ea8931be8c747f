"""The serving layer over real HTTP: a uvicorn server on 127.0.0.1 in a thread, queried with httpx.

Fakes (tests/hub/serving_fakes.py) stand for hub modules; one test serves a real Predictor.
Every loop is bounded in count and time; assertions are on answers, batch sizes and metrics,
never on wall-clock time.
"""
import asyncio
import base64
import contextlib
import importlib.util
import io
import json
import logging
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paddlejax.hub.serving import Limits, create_app, make_server

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("serving_fakes", HERE / "serving_fakes.py")
fakes = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fakes)

TIMEOUT = 10  # seconds: any single HTTP exchange in these tests


def wait_for(condition, seconds: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Running:
    """A server running in a thread: ``url``, ``port``, ``state`` (the app's ServingState)."""

    def __init__(self, modules, **kwargs):
        self.server = make_server(modules, port=0, log_level="warning", **kwargs)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), 20, "the server to start")
        assert self.server.started, "the server did not start"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = self.server.config.app.state.serving
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the server did not stop"

    def __exit__(self, *exc):
        if self.thread.is_alive():
            self.stop()

    def post(self, path, **kwargs):
        return httpx.post(self.url + path, timeout=TIMEOUT, **kwargs)

    def get(self, path):
        return httpx.get(self.url + path, timeout=TIMEOUT)


def post_all(url: str, bodies: list, path: str = "/predict/lengths") -> list[httpx.Response]:
    """POST every JSON body at once from one async client; the responses in order."""
    async def main():
        limits = httpx.Limits(max_connections=len(bodies))
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT, limits=limits) as client:
            return await asyncio.gather(*(client.post(path, json=b) for b in bodies))

    return asyncio.run(main())


def raw_exchange(port: int, data: bytes, timeout: float = TIMEOUT) -> tuple[int, dict, dict]:
    """Send raw bytes on a new connection; the status, headers and JSON body answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk and time.monotonic() < deadline, f"no complete answer: {received[:200]!r}"
            received += chunk
        head, body = received.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(headers["content-length"]):
            chunk = sock.recv(65536)
            assert chunk and time.monotonic() < deadline, "answer cut short"
            body += chunk
        return int(lines[0].split()[1]), headers, json.loads(body)


def assert_error(response: httpx.Response, status: int, code: str, *words: str) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"status", "msg", "results"} and doc["status"] == code and doc["results"] == [], doc
    for word in words:
        assert word in doc["msg"], doc["msg"]


def metric_samples(text: str) -> dict:
    """``{(name, frozenset(labels)): value}`` of a Prometheus text page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def png_base64(width: int, height: int, value: int = 7) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (width, height), value).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
def lengths():
    with Running({"lengths": fakes.TextLengths()}) as running:
        yield running


# ---------------------------------------------------------------------------------------
# Answers

def test_predict_answers_in_paddle_shape(lengths):
    response = lengths.post("/predict/lengths", json={"texts": ["hello", "", "ünï"]})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    doc = response.json()
    assert doc["status"] == "000" and doc["msg"] == ""
    assert [r["length"] for r in doc["results"]] == [5, 0, 3]
    assert lengths.post("/predict/lengths", json={"texts": []}).json() == {"status": "000", "msg": "",
                                                                         "results": []}


def test_health_and_module_info(lengths):
    assert lengths.get("/health").json() == {"status": "ok", "modules": {
        "lengths": {"version": "1.0.0", "task": "text-classification"}}}
    info = lengths.get("/modules/lengths").json()
    assert info["name"] == "lengths" and info["task"] == "text-classification" and "inputs" in info
    assert_error(lengths.get("/modules/nope"), 404, "102", "nope", "lengths")


def test_images_are_decoded_and_checked():
    limits = Limits(max_image_pixels=64 * 64, max_image_bytes=1 << 16)
    with Running({"sizes": fakes.ImageSizes()}, limits=limits) as s:
        ok = s.post("/predict/sizes", json={"images": [png_base64(3, 2, 10), png_base64(5, 4, 20)]})
        assert ok.json()["results"] == [{"width": 3, "height": 2, "mean": 10.0}, {"width": 5, "height": 4,
                                                                                   "mean": 20.0}]
        assert_error(s.post("/predict/sizes", json={"images": [png_base64(100, 100)]}), 413, "103", "100x100")
        assert_error(s.post("/predict/sizes", json={"images": ["not base64 !"]}), 400, "101", "images[0]")
        assert_error(s.post("/predict/sizes", json={"images": [base64.b64encode(b"GIF89a...").decode()]}),
                     400, "101", "not a base64 PNG")
        assert_error(s.post("/predict/sizes", json={"images": ["A" * (1 << 17)]}), 413, "103", "bytes")


# ---------------------------------------------------------------------------------------
# Dynamic batching

def test_batching_gathers_concurrent_requests():
    module = fakes.TextLengths(delay=0.05, max_batch_size=16)
    with Running({"lengths": module}, max_wait_ms=20) as s:
        responses = post_all(s.url, [{"texts": [f"t{i}"]} for i in range(32)])
        assert all(r.status_code == 200 for r in responses)
        metrics = metric_samples(s.get("/metrics").text)
    assert sum(module.batches) == 32 and max(module.batches) <= 16
    assert max(module.batches) > 1 and len(module.batches) < 32, module.batches  # batched, not one by one
    assert module.most_at_once == 1
    assert metrics[("paddlejax_hub_batch_size_count", frozenset({("module", "lengths")}))] == len(module.batches)
    assert metrics[("paddlejax_hub_batch_size_sum", frozenset({("module", "lengths")}))] == 32
    seen = {r.json()["results"][0]["batch"] for r in responses}
    assert seen == set(module.batches)


def test_batching_off_runs_each_request_alone():
    module = fakes.TextLengths(delay=0.01)
    with Running({"lengths": module}, batching=False) as s:
        sizes = [1, 3, 2, 5, 1, 4, 2, 3]
        responses = post_all(s.url, [{"texts": ["x"] * n} for n in sizes])
    assert [r.json()["results"][0]["batch"] for r in responses] == sizes
    assert sorted(module.batches) == sorted(sizes) and module.most_at_once == 1


def test_workers_per_module_run_batches_side_by_side():
    module = fakes.TextLengths(delay=0.1)
    with Running({"lengths": module}, batching=False, workers_per_module=2) as s:
        responses = post_all(s.url, [{"texts": [f"w{i}"]} for i in range(6)])
    assert all(r.status_code == 200 for r in responses) and module.most_at_once == 2


def test_results_go_back_to_their_request():
    module = fakes.TextLengths(delay=0.02, max_batch_size=8)
    rng = np.random.default_rng(0)
    bodies = [{"texts": [f"r{i}-{j}" + "x" * int(rng.integers(0, 5)) for j in range(int(rng.integers(1, 6)))]}
              for i in range(40)]
    with Running({"lengths": module}, max_wait_ms=10) as s:
        responses = post_all(s.url, bodies)
    for body, response in zip(bodies, responses):
        results = response.json()["results"]
        assert [r["text"] for r in results] == body["texts"]
        assert [r["length"] for r in results] == [len(t) for t in body["texts"]]
    assert max(module.batches) > 1


def test_a_request_over_the_batch_size_runs_alone():
    module = fakes.TextLengths(max_batch_size=4)
    with Running({"lengths": module}) as s:
        results = s.post("/predict/lengths", json={"texts": ["y"] * 10}).json()["results"]
    assert [r["batch"] for r in results] == [10] * 10 and module.batches == [10]


def test_serving_a_predictor_compiles_nothing():
    module = fakes.Doubler()
    compiled = module.predictor.num_compilations
    with Running({"doubler": module}, max_wait_ms=10) as s:
        bodies = [{"rows": [[i, j, 1.5] for j in range(1 + i % 11)]} for i in range(30)]  # 1..11 rows, and batches
        responses = post_all(s.url, bodies, path="/predict/doubler")
        for body, response in zip(bodies, responses):
            assert response.json()["results"] == [[2.0 * v for v in row] for row in body["rows"]]
        batches = metric_samples(s.get("/metrics").text)[("paddlejax_hub_batch_size_count",
                                                          frozenset({("module", "doubler")}))]
    assert module.predictor.num_compilations == compiled
    assert batches < len(bodies)


# ---------------------------------------------------------------------------------------
# Errors: each a JSON answer with its status

@pytest.mark.parametrize("content, words", [
    (b'{"texts": ["a"', "not JSON"),
    (bytes(range(256)) * 4, "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'["a", "b"]', "JSON object"),
    (b'"texts"', "JSON object"),
    (b'{"text": ["a"]}', "missing key 'texts'"),
    (b'{"texts": "abc"}', "list of strings"),
    (b'{"texts": [1, 2]}', "list of strings"),
    (b"", "empty request body"),
    (b"   \n", "empty request body"),
])
def test_malformed_bodies_are_400(lengths, content, words):
    response = lengths.post("/predict/lengths", content=content, headers={"content-type": "application/json"})
    assert_error(response, 400, "101", words)


def test_too_many_or_too_long_texts_are_413(lengths):
    assert_error(lengths.post("/predict/lengths", json={"texts": ["a"] * 10_000}), 413, "103", "10000")
    assert_error(lengths.post("/predict/lengths", json={"texts": ["a" * 10_001]}), 413, "103", "10001")


def test_body_over_the_limit_by_content_length_is_not_read(lengths):
    head = (b"POST /predict/lengths HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n")
    status, headers, doc = raw_exchange(lengths.port, head)
    assert (status, doc["status"], headers["connection"]) == (413, "103", "close")
    assert "1000000000" in doc["msg"]
    assert lengths.post("/predict/lengths", json={"texts": ["still fine"]}).status_code == 200


def test_body_over_the_limit_while_streaming_stops_the_read():
    limit = 64 << 10
    with Running({"lengths": fakes.TextLengths()}, limits=Limits(max_body_bytes=limit)) as s:
        def chunks(n):  # no Content-Length: httpx sends it chunked
            yield b'{"texts": ["'
            for _ in range(n):
                yield b"a" * (16 << 10)

        assert_error(s.post("/predict/lengths", content=chunks(6)), 413, "103", f"{limit} bytes")

        produced = []

        def endless():
            for i in range(4096):  # 64 MiB, far past the limit: the server must stop reading
                produced.append(i)
                yield b"b" * (16 << 10)

        with contextlib.suppress(httpx.TransportError):  # the server closes the connection
            assert_error(s.post("/predict/lengths", content=endless()), 413, "103")
        assert len(produced) < 4096
        assert s.post("/predict/lengths", json={"texts": ["ok"]}).status_code == 200


def test_a_stalled_body_is_408_and_closes():
    with Running({"lengths": fakes.TextLengths()}, limits=Limits(request_timeout_s=0.3)) as s:
        half = (b"POST /predict/lengths HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{\"texts\": [")
        status, headers, doc = raw_exchange(s.port, half)
        assert (status, doc["status"], headers["connection"]) == (408, "105", "close")
        assert s.post("/predict/lengths", json={"texts": ["ok"]}).status_code == 200


def test_wrong_content_type_is_415(lengths):
    assert_error(lengths.post("/predict/lengths", content=b"texts=a", headers={
        "content-type": "application/x-www-form-urlencoded"}), 415, "107", "application/json")
    assert_error(lengths.post("/predict/lengths", content=b"{}", headers={"content-type": "text/plain"}), 415, "107")
    assert lengths.post("/predict/lengths", content=b'{"texts": ["a"]}',
                        headers={"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_unknown_module_route_and_method(lengths):
    assert_error(lengths.post("/predict/nope", json={"texts": ["a"]}), 404, "102", "'nope'", "served: lengths")
    assert_error(lengths.get("/nowhere"), 404, "102", "/nowhere")
    response = lengths.get("/predict/lengths")
    assert_error(response, 405, "106", "GET")
    assert response.headers["allow"] == "POST"


def test_a_module_crash_is_500_and_the_server_goes_on(caplog):
    with caplog.at_level(logging.ERROR, logger="paddlejax.hub.serving"):
        with Running({"fail": fakes.Failing(name="fail")}) as s:
            assert_error(s.post("/predict/fail", json={"texts": ["boom"]}), 500, "199", "ZeroDivisionError")
            assert_error(s.post("/predict/fail", json={"texts": ["refuse"]}), 400, "101", "refuses")
            assert s.post("/predict/fail", json={"texts": ["fine"]}).json()["results"][0]["length"] == 4
            assert s.get("/health").status_code == 200
    assert "ZeroDivisionError: boom" in caplog.text and "Traceback" in caplog.text


def test_a_slow_module_is_504_and_its_results_are_dropped():
    module = fakes.TextLengths(delay=0.4)
    with Running({"lengths": module}, limits=Limits(request_timeout_s=0.1)) as s:
        assert_error(s.post("/predict/lengths", json={"texts": ["slow"]}), 504, "105", "0.1 s")
        wait_for(lambda: module.batches == [1], what="the timed-out batch to finish")
        module.delay = 0
        assert s.post("/predict/lengths", json={"texts": ["next"]}).json()["results"][0]["text"] == "next"


def test_over_max_concurrency_is_503():
    module = fakes.TextLengths(delay=0.5)
    with Running({"lengths": module}, limits=Limits(max_concurrency=1)) as s:
        with httpx.Client(base_url=s.url, timeout=TIMEOUT) as client, \
                httpx.Client(base_url=s.url, timeout=TIMEOUT) as other:
            slow = threading.Thread(target=lambda: results.append(client.post("/predict/lengths",
                                                                              json={"texts": ["a"]})))
            results = []
            slow.start()
            wait_for(lambda: s.state.in_flight == 1, what="the slow request")
            assert_error(other.post("/predict/lengths", json={"texts": ["b"]}), 503, "104", "overloaded")
            assert other.get("/health").status_code == 200  # only predictions count
            slow.join(TIMEOUT)
            assert results[0].status_code == 200
            assert other.post("/predict/lengths", json={"texts": ["c"]}).status_code == 200


def test_over_max_queue_is_503():
    module = fakes.TextLengths(delay=0.3, max_batch_size=2)
    with Running({"lengths": module}, batching=False, limits=Limits(max_items=4, max_queue=4)) as s:
        responses = post_all(s.url, [{"texts": ["q"] * 2} for _ in range(8)])
    codes = sorted(r.status_code for r in responses)
    assert codes.count(503) >= 3 and set(codes) == {200, 503}, codes
    assert all(r.json()["status"] == "104" for r in responses if r.status_code == 503)


# ---------------------------------------------------------------------------------------
# Metrics, OpenAPI, shutdown

def test_metrics_count_requests_and_errors():
    with Running({"lengths": fakes.TextLengths(), "other": fakes.TextLengths(name="other")},
                 batching=False) as s:
        for i in range(5):
            assert s.post("/predict/lengths", json={"texts": ["a"] * (i + 1)}).status_code == 200
        for _ in range(2):
            s.post("/predict/lengths", content=b"{", headers={"content-type": "application/json"})
        s.post("/predict/ghost", json={"texts": ["a"]})
        s.post("/predict/other", json={"texts": ["a"]})
        text = s.get("/metrics").text
    m = metric_samples(text)
    label = lambda **kw: frozenset(kw.items())  # noqa: E731
    assert m[("paddlejax_hub_requests_total", label(module="lengths", code="200"))] == 5
    assert m[("paddlejax_hub_requests_total", label(module="lengths", code="400"))] == 2
    assert m[("paddlejax_hub_requests_total", label(module="-", code="404"))] == 1
    assert m[("paddlejax_hub_requests_total", label(module="other", code="200"))] == 1
    assert m[("paddlejax_hub_errors_total", label(module="lengths", reason="bad_request"))] == 2
    assert m[("paddlejax_hub_errors_total", label(module="-", reason="not_found"))] == 1
    assert m[("paddlejax_hub_batch_size_count", label(module="lengths"))] == 5
    assert m[("paddlejax_hub_batch_size_sum", label(module="lengths"))] == 15
    assert m[("paddlejax_hub_batch_size_bucket", label(module="lengths", le="4.0"))] == 4
    assert m[("paddlejax_hub_request_latency_seconds_count", label(module="lengths"))] == 7
    assert m[("paddlejax_hub_in_flight", label())] == 0
    assert m[("paddlejax_hub_queue_items", label(module="lengths"))] == 0


def test_two_apps_in_one_process_count_apart():
    a, b = create_app({"lengths": fakes.TextLengths()}), create_app({"lengths": fakes.TextLengths()})
    a.state.serving.metrics.requests.labels(module="lengths", code="200").inc()
    text = b.state.serving.metrics.render()[0].decode()
    assert 'paddlejax_hub_requests_total{code="200",module="lengths"}' not in text


def test_openapi_describes_the_routes_and_modules():
    with Running({"lengths": fakes.TextLengths(), "sizes": fakes.ImageSizes()}) as s:
        doc = s.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert {p: sorted(ops) for p, ops in doc["paths"].items()} == {
        "/predict/{module}": ["post"], "/health": ["get"], "/modules/{name}": ["get"], "/metrics": ["get"],
        "/openapi.json": ["get"]}
    predict = doc["paths"]["/predict/{module}"]["post"]
    assert predict["parameters"][0]["schema"]["enum"] == ["lengths", "sizes"]
    assert {"200", "400", "404", "413", "415", "500", "503", "504"} <= set(predict["responses"])
    refs = [s["$ref"].rsplit("/", 1)[1] for s in predict["requestBody"]["content"]["application/json"]["schema"]
            ["oneOf"]]
    assert refs == ["TextsRequest", "ImagesRequest"] and set(refs) <= set(doc["components"]["schemas"])
    assert doc["x-modules"]["sizes"]["task"] == "image-classification"


def test_shutdown_answers_the_request_in_flight():
    module = fakes.TextLengths(delay=0.5)
    s = Running({"lengths": module})
    with s:
        results = []
        slow = threading.Thread(target=lambda: results.append(s.post("/predict/lengths", json={"texts": ["last"]})))
        slow.start()
        wait_for(lambda: s.state.in_flight == 1, what="the slow request")
        s.server.should_exit = True
        slow.join(TIMEOUT)
        s.thread.join(TIMEOUT)
        assert not s.thread.is_alive()
        assert results[0].status_code == 200 and results[0].json()["results"][0]["text"] == "last"
        with pytest.raises(httpx.ConnectError):
            httpx.post(s.url + "/predict/lengths", json={"texts": ["late"]}, timeout=2)
    assert s.state.closing and s.state.in_flight == 0


def test_create_app_refuses_what_is_not_a_servable():
    with pytest.raises(TypeError, match="lacks .*run_batch"):
        create_app({"x": object()})
    with pytest.raises(ValueError, match="max_queue"):
        Limits(max_items=10, max_queue=5)


# ---------------------------------------------------------------------------------------
# Ray Serve

@pytest.mark.slow
def test_ray_serve_spreads_requests_over_two_replicas(tmp_path):
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from paddlejax.hub.serving import deploy_on_ray

    with socket.socket() as sock:  # a free port for Ray's proxy
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    try:
        deploy_on_ray(["lengths:0.01"], loader="serving_fakes:load_servable", num_replicas=2, port=port,
                      ray_actor_options={"num_cpus": 0.5}, hub_home=tmp_path, max_wait_ms=2)
        url = f"http://127.0.0.1:{port}"
        responses = post_all(url, [{"texts": [f"r{i}", "x"]} for i in range(40)])
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
        assert [r.json()["results"][0]["text"] for r in responses] == [f"r{i}" for i in range(40)]
        pids = {r.json()["results"][0]["pid"] for r in responses}
        assert len(pids) == 2, pids
        assert_error(httpx.post(url + "/predict/nope", json={"texts": []}, timeout=TIMEOUT), 404, "102", "lengths")
        assert httpx.get(url + "/health", timeout=TIMEOUT).json()["status"] == "ok"
        assert httpx.get(url + "/modules/lengths", timeout=TIMEOUT).json()["hub_home"] == str(tmp_path)
    finally:
        serve.shutdown()
        ray.shutdown()
