#!/usr/bin/env python3
"""kvfuse-server under the real `openai` Python client.

Starts the real kvfuse-server (KVFUSE_SERVER_BIN) with SmolLM2 (KVFUSE_MODEL, else the file scripts/fetch_model.sh
caches) on a free loopback port and checks completions (non-streamed and streamed, equal at temperature 0), usage
and kvfuse's usage object (chunks loaded when their parts come back in another order), stop sequences, seeded
sampling, OpenAI-style errors (400 naming the field, 413, 429, 404), /v1/models, /health, /metrics, a bounded
memory tier, a client that goes away mid-stream, two servers sharing chunk caches through one redis-server
(one of them SIGKILLed mid-request while the other serves; Redis killed mid-run), and, where the server was built
with the llama.cpp integration (KVFUSE_SERVER_LLAMACPP=1), --engine llamacpp: chunk caches stored and reused,
concurrent requests answering as one at a time, streaming, seeded sampling, and what it refuses.

Exit code 77 (CTest: skipped) when the model, the binary or the openai client (installed into KVFUSE_SERVER_VENV,
a venv, when missing) is not available, or when KVFUSE_SERVER_OPTIMIZED=0 (a Debug or sanitizer build).
"""
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

SKIP = 77


def skip(why):
    print(f"test_server.py: skipped: {why}", file=sys.stderr)
    sys.exit(SKIP)


def ensure_openai():
    """Imports openai, or installs it into KVFUSE_SERVER_VENV (a venv) and runs this script again from there."""
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("KVFUSE_SERVER_VENV")
    if not venv or os.environ.get("KVFUSE_SERVER_IN_VENV") == "1":
        skip("the openai package is missing (set KVFUSE_SERVER_VENV to install it into a venv)")
    python = os.path.join(venv, "bin", "python3")
    if not os.path.exists(python):
        if subprocess.run([sys.executable, "-m", "venv", venv]).returncode != 0:
            skip(f"cannot create a venv at {venv}")
    if subprocess.run([python, "-c", "import openai"], capture_output=True).returncode != 0:
        if subprocess.run([python, "-m", "pip", "install", "--quiet", "openai"]).returncode != 0:
            skip("cannot install the openai package (pip install openai failed)")
    os.environ["KVFUSE_SERVER_IN_VENV"] = "1"
    os.execv(python, [python] + sys.argv)


def cache_dir():
    if os.environ.get("KVFUSE_CACHE_DIR"):
        return os.environ["KVFUSE_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvfuse")


BINARY = os.environ.get("KVFUSE_SERVER_BIN", "")
MODEL = os.environ.get("KVFUSE_MODEL") or os.path.join(cache_dir(), "SmolLM2-135M-Instruct.Q4_1.gguf")
MAX_BODY = 65536
# The servers' kvfuse cache (calibrations for --method auto) is a fresh directory, so that `auto` is what a new
# machine gets (CacheBlend's r = 15 %), whatever kvfuse-rag-eval --calibrated cached for this user; the model is
# passed by path.
SERVER_CACHE = tempfile.mkdtemp(prefix="kvfuse-server-test-cache-")
atexit.register(shutil.rmtree, SERVER_CACHE, True)


class Server:
    """A kvfuse-server process on a port it picked itself (--port 0)."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([BINARY, "--model", MODEL, "--port", "0", "--threads", "2", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, KVFUSE_CACHE_DIR=SERVER_CACHE))
        self.log = []
        self.port = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                if "listening on http://" in line:
                    self.port = int(line.rsplit(":", 1)[1])
                    ready.set()
            ready.set()

        self.drain = threading.Thread(target=drain, daemon=True)
        self.drain.start()
        if not ready.wait(120) or self.port is None:
            self.stop()
            raise RuntimeError("kvfuse-server did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", **{"max_retries": 0, "timeout": 120, **kw})

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.status, r.read().decode()

    def post(self, path, body: bytes):
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.drain.join(10)
        self.proc.stderr.close()


def parts(*texts):
    return [{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}]


def kvfuse_usage(completion):
    return completion.model_dump()["usage"]["kvfuse"]


PASSAGES = [
    "The Rhine rises in the Swiss Alps and flows north through Germany into the Netherlands.",
    "Lake Constance lies on the Rhine at the border of Germany, Switzerland and Austria.",
    "The Danube flows east from the Black Forest through Vienna, Budapest and Belgrade.",
]
QUESTION = "Which river flows through Lake Constance?"
KOSCIUSZKO = ["Mount Kosciuszko is the highest mountain of mainland Australia.",
              "It was named by the Polish explorer Pawel Strzelecki in 1840."]


class OneServerTest(unittest.TestCase):
    """A server started with ARGS for the class, and chat() on it: greedy, 8 tokens unless told otherwise."""
    ARGS = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(*cls.ARGS)
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, messages, **kw):
        kw.setdefault("temperature", 0)
        kw.setdefault("max_tokens", 8)
        return self.client.chat.completions.create(model="smollm2", messages=messages, **kw)


class ServerTest(OneServerTest):
    ARGS = ("--max-body-bytes", str(MAX_BODY))

    def stream_text(self, messages, **kw):
        kw.setdefault("temperature", 0)
        kw.setdefault("max_tokens", 8)
        text, finish, usage = "", None, None
        stream = self.client.chat.completions.create(model="smollm2", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}, **kw)
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.model_dump()["usage"]
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish, usage

    def test_models_and_health(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["SmolLM2-135M-Instruct.Q4_1"])
        status, body = self.server.get("/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["status"], "ok")

    def test_stream_equals_non_stream(self):
        for method in ("full", "cacheblend"):
            with self.subTest(method=method):
                messages = [{"role": "system", "content": "Answer from the documents."}] + parts(*PASSAGES, QUESTION)
                extra = {"extra_body": {"kvfuse": {"method": method}}}
                self.chat(messages, **extra)  # the chunk caches stored: both runs below load the same ones
                done = self.chat(messages, max_tokens=12, **extra)
                text, finish, usage = self.stream_text(messages, max_tokens=12, **extra)
                self.assertTrue(done.choices[0].message.content)
                self.assertEqual(text, done.choices[0].message.content)
                self.assertEqual(finish, done.choices[0].finish_reason)
                self.assertIn(finish, ("stop", "length"))
                self.assertEqual(usage["prompt_tokens"], done.usage.prompt_tokens)
                self.assertEqual(usage["completion_tokens"], done.usage.completion_tokens)
                self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
                self.assertEqual(usage["kvfuse"]["method"], method)
                self.assertEqual(kvfuse_usage(done)["loaded_tokens"], usage["kvfuse"]["loaded_tokens"])
                if method == "cacheblend":
                    self.assertGreater(usage["kvfuse"]["loaded_tokens"], 0)

    def test_usage_and_reuse_in_another_order(self):
        texts = ["Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie.",
                 "She won a second Nobel Prize, in Chemistry, in 1911.",
                 "Her daughter Irene Joliot-Curie won the Chemistry prize in 1935."]
        first = self.chat(parts(*texts, "How many Nobel Prizes did Marie Curie win?"))
        second = self.chat(parts(texts[2], texts[0], texts[1], "How many Nobel Prizes did Marie Curie win?"))
        u1, u2 = kvfuse_usage(first), kvfuse_usage(second)
        self.assertEqual(first.usage.total_tokens, first.usage.prompt_tokens + first.usage.completion_tokens)
        self.assertGreater(first.usage.prompt_tokens, 40)
        self.assertEqual(first.usage.prompt_tokens, second.usage.prompt_tokens)
        self.assertEqual(u1["method"], "cacheblend")
        self.assertEqual(u2["chunks"], 3)  # three parts; the system turn is the chunk context, the question the query
        self.assertGreater(u2["loaded_tokens"], u1["loaded_tokens"])
        self.assertGreaterEqual(u2["loaded_tokens"], u2["chunk_tokens"])
        self.assertLess(u2["recomputed_tokens"], second.usage.prompt_tokens)
        self.assertGreater(u2["ttft_ms"], 0)

    def test_cachecraft_reuses_the_variants_its_own_requests_computed(self):
        texts = ["The Nile is about 6650 kilometres long and flows north into the Mediterranean Sea.",
                 "Its two main tributaries, the White Nile and the Blue Nile, meet at Khartoum.",
                 "The Aswan High Dam, finished in 1970, holds back Lake Nasser."]
        question = "Where do the White Nile and the Blue Nile meet?"
        extra = {"extra_body": {"kvfuse": {"method": "cachecraft@0.5"}}}
        first = self.chat(parts(*texts, question), **extra)
        second = self.chat(parts(texts[1], texts[2], texts[0], question), **extra)
        u1, u2 = kvfuse_usage(first), kvfuse_usage(second)
        self.assertEqual((u1["method"], u2["method"]), ("cachecraft@0.5", "cachecraft@0.5"))
        # The first request found no variant: every row computed, its three parts left as variants.
        self.assertEqual(u1["loaded_tokens"], 0)
        self.assertAlmostEqual(u1["recomputed_tokens"], first.usage.prompt_tokens, delta=0.5)
        # The second loads each part's variant and fixes its most contextualized tokens (Cache-Craft eq. 14).
        self.assertGreaterEqual(u2["loaded_tokens"], u2["chunk_tokens"])
        self.assertLess(u2["recomputed_tokens"], second.usage.prompt_tokens)
        self.assertTrue(second.choices[0].message.content)
        # /metrics counts the variants the engine keeps: at least the first request's three parts.
        metrics = dict(line.split() for line in self.server.get("/metrics")[1].splitlines()
                       if line.startswith("kvfuse_cachecraft_"))
        self.assertGreaterEqual(int(metrics["kvfuse_cachecraft_variants"]), 3)
        self.assertGreaterEqual(int(metrics["kvfuse_cachecraft_variants_inserted_total"]),
                                int(metrics["kvfuse_cachecraft_variants"]))
        self.assertEqual(int(metrics["kvfuse_cachecraft_variants_capacity"]), 500)  # N = 100 x M = 5

    def test_parts_are_reused_behind_the_same_system_prompt_only(self):
        texts = ["The Amazon river discharges more water than the next seven largest rivers combined.",
                 "Its basin covers about seven million square kilometres."]
        question = "How large is the Amazon basin?"
        brief = {"role": "system", "content": "Answer briefly."}
        word = {"role": "system", "content": "Answer in one word."}
        first = self.chat([brief] + parts(*texts, question))
        same = self.chat([brief] + parts(texts[1], texts[0], question))
        other = self.chat([word] + parts(texts[1], texts[0], question))
        self.assertEqual(kvfuse_usage(first)["loaded_tokens"], 0)
        self.assertGreaterEqual(kvfuse_usage(same)["loaded_tokens"], kvfuse_usage(same)["chunk_tokens"])
        # The chunk caches were computed behind the first system prompt: under another one they are computed anew.
        self.assertEqual(kvfuse_usage(other)["loaded_tokens"], 0)
        self.assertEqual(kvfuse_usage(other)["chunks"], 2)

    def test_stop_sequences_and_seeded_sampling(self):
        messages = parts(*PASSAGES, "Name the three countries of the first document.")
        extra = {"extra_body": {"kvfuse": {"method": "full"}}}
        whole = self.chat(messages, max_tokens=10, **extra).choices[0].message.content
        words = whole.split()
        self.assertGreaterEqual(len(words), 3, whole)
        stop = " " + words[2]
        cut = self.chat(messages, max_tokens=10, stop=[stop, "never appears"], **extra)
        self.assertEqual(cut.choices[0].message.content, whole[:whole.find(stop)])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        text, finish, _ = self.stream_text(messages, max_tokens=10, stop=stop, **extra)
        self.assertEqual((text, finish), (whole[:whole.find(stop)], "stop"))
        a = self.chat(messages, temperature=0.9, seed=7, **extra).choices[0].message.content
        b = self.chat(messages, temperature=0.9, seed=7, **extra).choices[0].message.content
        self.assertEqual(a, b)

    def test_errors_name_the_field(self):
        import openai
        cases = [
            ({"max_tokens": 0}, "max_tokens"),
            ({"temperature": 3}, "temperature"),
            ({"stop": ""}, "stop"),
            ({"extra_body": {"kvfuse": {"method": "prefix"}}}, "kvfuse.method"),
            ({"extra_body": {"n": 2}}, "n"),
        ]
        for kw, param in cases:
            with self.subTest(param=param):
                with self.assertRaises(openai.BadRequestError) as e:
                    self.chat(parts("A part.", "A question?"), **kw)
                self.assertEqual(e.exception.param, param)
                self.assertEqual(e.exception.type, "invalid_request_error")
                self.assertIn(param, e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
        self.assertEqual(e.exception.param, "messages[0].content[0].type")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat([{"role": "robot", "content": "hi"}])
        self.assertEqual(e.exception.param, "messages[0].role")
        with self.assertRaises(openai.BadRequestError) as e:  # beyond the model's context, under the body limit
            self.chat([{"role": "user", "content": "word " * 9000}])
        self.assertEqual(e.exception.code, "context_length_exceeded")
        self.assertIn("8192", e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(parts("A part.", "A question?"), max_tokens=9000)
        self.assertEqual((e.exception.param, e.exception.code), ("max_tokens", "context_length_exceeded"))
        status, body = self.server.post("/v1/chat/completions", b'{"messages": [')
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["error"]["code"], "invalid_json")
        status, body = self.server.post("/v1/chat/completions", b'{"messages": []}')
        self.assertEqual((status, json.loads(body)["error"]["param"]), (400, "messages"))
        with self.assertRaises(openai.APIStatusError) as e:
            self.chat([{"role": "user", "content": "x" * (2 * MAX_BODY)}])
        self.assertEqual(e.exception.status_code, 413)
        self.assertEqual(e.exception.code, "request_too_large")
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="smollm2", prompt="legacy completions")
        self.assertEqual(e.exception.code, "not_found")
        with self.assertRaises(urllib.error.HTTPError) as e:
            self.server.get("/no/such/route")
        self.assertEqual(e.exception.code, 404)
        self.assertEqual(self.chat(parts("Still serving.", "Say yes.")).usage.prompt_tokens > 0, True)

    def test_client_leaving_mid_stream(self):
        stream = self.client.chat.completions.create(model="smollm2", messages=parts("A long story.", "Tell it."),
                                                     stream=True, temperature=0, max_tokens=400)
        received = 0
        for _ in stream:
            received += 1
            if received == 3:
                break
        stream.close()  # the connection goes away with the request still generating
        deadline = time.time() + 60
        while time.time() < deadline:
            metrics = self.server.get("/metrics")[1]
            if 'kvfuse_requests_finished_total{reason="cancelled"}' in metrics:
                break
            time.sleep(0.2)
        self.assertIn('kvfuse_requests_finished_total{reason="cancelled"}', metrics)
        done = self.chat(parts(*PASSAGES, QUESTION), extra_body={"kvfuse": {"method": "full"}})
        self.assertTrue(done.choices[0].message.content)
        self.assertEqual(json.loads(self.server.get("/health")[1])["in_flight"], 0)

    def test_client_leaving_a_non_streamed_request_cancels_it(self):
        import openai

        def finished(reason):
            metrics = self.server.get("/metrics")[1]
            line = f'kvfuse_requests_finished_total{{reason="{reason}"}} '
            return next((float(m[len(line):]) for m in metrics.splitlines() if m.startswith(line)), 0.0)

        cancelled, length = finished("cancelled"), finished("length")
        impatient = self.server.client(timeout=1.5)  # gives up mid-answer and closes its connection
        with self.assertRaises(openai.APITimeoutError):
            # An answer that runs to max_tokens at temperature 0 (it counts on without an end of text).
            impatient.chat.completions.create(
                model="smollm2", messages=parts("Write the numbers from one to five hundred in words.", "Go."),
                temperature=0, max_tokens=2000)
        def in_flight():
            return json.loads(self.server.get("/health")[1])["in_flight"]

        deadline = time.time() + 60
        while time.time() < deadline and (finished("cancelled") == cancelled or in_flight() > 0):
            time.sleep(0.2)
        self.assertEqual(finished("cancelled"), cancelled + 1)
        self.assertEqual(finished("length"), length)  # it did not run to its token limit
        self.assertEqual(in_flight(), 0)

    def test_a_conversations_earlier_turns_are_a_stored_prefix_loaded_by_cake(self):
        system = "Answer from these notes. " + " ".join(PASSAGES * 5)  # about 280 tokens: two whole 128-token chunks
        turn1 = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
        first = self.chat(turn1)
        turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And which river flows through Vienna?"}]
        second = self.chat(turn2, max_tokens=12)
        u1, u2 = kvfuse_usage(first), kvfuse_usage(second)
        self.assertEqual((u1["method"], u1["prefix_tokens"], u1["chunks"]), ("full", 0, 0))
        self.assertGreater(first.usage.prompt_tokens, 256)
        self.assertEqual(u2["method"], "full")
        # The first request's whole 128-token chunks were stored: its prompt's, then those its answer completed (the
        # answer's tokens as the second prompt has them again); the second starts with them.
        p1, a1 = first.usage.prompt_tokens, first.usage.completion_tokens
        self.assertIn(u2["prefix_tokens"], range(p1 // 128 * 128, (p1 + a1) // 128 * 128 + 1, 128))
        self.assertEqual(u2["recomputed_tokens"] + u2["loaded_tokens"], second.usage.prompt_tokens)
        # Cake's compute chunk comes from the measured compute speed, and the memory tier's fetches are far faster:
        # the stored prefix is loaded, not computed again.
        self.assertGreater(u2["loaded_tokens"], 0)
        # Cake's answer is full prefill's: a server without the prefix cache computes it.
        plain = Server("--prefix-cache", "off")
        try:
            again = plain.client().chat.completions.create(model="smollm2", messages=turn2, temperature=0, max_tokens=12)
        finally:
            plain.stop()
        self.assertEqual(kvfuse_usage(again)["prefix_tokens"], 0)
        self.assertEqual(again.choices[0].message.content, second.choices[0].message.content)

    def test_metrics(self):
        self.chat(parts(*PASSAGES, QUESTION))
        status, text = self.server.get("/metrics")
        self.assertEqual(status, 200)
        for name in ("kvfuse_http_requests_total", "kvfuse_requests_finished_total", "kvfuse_ttft_seconds_bucket",
                     "kvfuse_ttft_seconds_count", "kvfuse_step_seconds_bucket", "kvfuse_tokens_loaded_total",
                     "kvfuse_tokens_recomputed_total", "kvfuse_store_hits_total", "kvfuse_store_misses_total",
                     "kvfuse_load_wait_seconds_total", "kvfuse_requests_in_flight"):
            self.assertIn(name, text)
        self.assertIn('kvfuse_http_requests_total{route="/v1/chat/completions",status="200"}', text)


@unittest.skipUnless(os.environ.get("KVFUSE_SERVER_LLAMACPP") == "1",
                     "kvfuse-server built without the llama.cpp integration (-DKVFUSE_LLAMACPP=ON)")
class LlamaCppEngineTest(OneServerTest):
    """--engine llamacpp: LlamaCppBatchEngine under the server's step loop (several requests per llama_decode)."""
    # 512 cells a request: every decode attends over all of the engine's cells (its regions, fillers included), so
    # the regions are kept as small as these prompts allow (1024 took 1.5 x as long, 2026-11-27).
    ARGS = ("--engine", "llamacpp", "--method", "attnlink", "--max-running", "4", "--region-cells", "512")

    def test_chunks_stored_by_one_request_are_loaded_by_the_next_in_another_order(self):
        texts = KOSCIUSZKO + ["Strzelecki named it after the Polish patriot Tadeusz Kosciuszko."]  # only this test's
        first = self.chat(parts(*texts, "Who named Mount Kosciuszko?"))
        second = self.chat(parts(texts[2], texts[0], texts[1], "Who named Mount Kosciuszko?"))
        u1, u2 = kvfuse_usage(first), kvfuse_usage(second)
        self.assertEqual(u1["method"], "attnlink")
        self.assertEqual(u1["loaded_tokens"], 0)
        self.assertEqual(first.usage.prompt_tokens, second.usage.prompt_tokens)
        self.assertGreaterEqual(u2["loaded_tokens"], u2["chunk_tokens"])
        self.assertLess(u2["recomputed_tokens"], second.usage.prompt_tokens)
        self.assertGreater(u2["ttft_ms"], 0)
        self.assertTrue(second.choices[0].message.content)

    def test_concurrent_requests_answer_as_one_at_a_time(self):
        questions = [QUESTION, "Where does the Danube flow?", "Where does the Rhine rise?"]
        for method in ("full", "attnlink"):
            with self.subTest(method=method):
                extra = {"extra_body": {"kvfuse": {"method": method}}}
                for q in questions:  # the chunk caches stored first: every run below has the same plan
                    self.chat(parts(*PASSAGES, q), max_tokens=1, **extra)
                alone = [self.chat(parts(*PASSAGES, q), max_tokens=8, **extra).choices[0].message.content
                         for q in questions]
                together = [None] * len(questions)

                def ask(i):
                    together[i] = self.chat(parts(*PASSAGES, questions[i]), max_tokens=8,
                                            **extra).choices[0].message.content

                threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                self.assertEqual(together, alone)

    def test_streamed_equals_non_streamed_and_sampling_is_seeded(self):
        messages = parts(*PASSAGES, QUESTION)
        done = self.chat(messages, max_tokens=10)
        text, finish = "", None
        for chunk in self.client.chat.completions.create(model="smollm2", messages=messages, stream=True,
                                                         temperature=0, max_tokens=10):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        self.assertEqual((text, finish), (done.choices[0].message.content, done.choices[0].finish_reason))
        a = self.chat(messages, temperature=0.9, seed=11, max_tokens=10).choices[0].message.content
        b = self.chat(messages, temperature=0.9, seed=11, max_tokens=10).choices[0].message.content
        self.assertEqual(a, b)

    def test_methods_it_cannot_run_and_prompts_beyond_its_cells_are_refused(self):
        import openai
        for method, why in (("cacheblend", "per layer"), ("queryaware", "per layer"),
                            ("cachecraft", "attention statistics")):
            with self.subTest(method=method):
                with self.assertRaises(openai.BadRequestError) as e:
                    self.chat(parts("A part.", "A question?"), extra_body={"kvfuse": {"method": method}})
                self.assertEqual(e.exception.param, "kvfuse.method")
                self.assertIn(why, e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat([{"role": "user", "content": "word " * 1500}])
        self.assertEqual(e.exception.code, "context_length_exceeded")
        self.assertIn("512", e.exception.message)
        self.assertEqual(json.loads(self.server.get("/health")[1])["status"], "ok")


class FlagTest(unittest.TestCase):
    def test_bad_prefix_cache_flags_are_refused_by_name(self):
        for args, says in ((["--prefix-cache", "maybe"], "--prefix-cache: 'maybe' is neither on nor off"),
                           (["--engine", "llamacpp", "--prefix-cache", "on"], "the llamacpp engine keeps no prefix")):
            with self.subTest(args=args):
                done = subprocess.run([BINARY, "--model", MODEL, *args], capture_output=True, text=True, timeout=60)
                self.assertEqual(done.returncode, 2)
                self.assertIn(says, done.stderr)


def cpu_has_amx_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "amx_bf16" in line.split() and "amx_tile" in line.split()
                       for line in f)
    except OSError:
        return False


class ProductsTest(unittest.TestCase):
    """--products: bf16 weight products on AMX, refused where the CPU has none, and bad values refused by name."""

    def test_bad_products_flags_are_refused_by_name(self):
        cases = [(["--products", "fp16"], "products: 'fp16' is neither fp32 nor bf16"),
                 (["--engine", "llamacpp", "--products", "bf16"], "--products bf16: the cpu engine's option")]
        if not cpu_has_amx_bf16():
            cases.append((["--products", "bf16"], "products = bf16 needs Intel AMX-BF16"))
        for args, says in cases:
            with self.subTest(args=args):
                done = subprocess.run([BINARY, "--model", MODEL, *args], capture_output=True, text=True, timeout=60)
                self.assertEqual(done.returncode, 2)
                self.assertIn(says, done.stderr)

    def test_bf16_server_reuses_parts_in_another_order_and_streams_as_it_answers(self):
        if not cpu_has_amx_bf16():
            self.skipTest("this CPU has no AMX-BF16")
        try:
            server = Server("--products", "bf16")
        except RuntimeError as e:  # the flag is there but the kernel does not grant the tile data (Linux < 5.16)
            if "needs Intel AMX-BF16" in str(e):
                self.skipTest("the kernel does not let this process use AMX")
            raise
        try:
            self.assertTrue(any("bf16 products" in line for line in server.log), "".join(server.log))
            client = server.client()
            chat = lambda messages, **kw: client.chat.completions.create(
                model="smollm2", messages=messages, temperature=0, max_tokens=12, **kw)
            first = chat(parts(*PASSAGES, QUESTION))
            second = chat(parts(PASSAGES[2], PASSAGES[0], PASSAGES[1], QUESTION))
            self.assertGreater(kvfuse_usage(second)["loaded_tokens"], kvfuse_usage(first)["loaded_tokens"])
            again = chat(parts(PASSAGES[2], PASSAGES[0], PASSAGES[1], QUESTION))
            streamed = "".join(c.choices[0].delta.content or "" for c in
                               chat(parts(PASSAGES[2], PASSAGES[0], PASSAGES[1], QUESTION), stream=True) if c.choices)
            self.assertTrue(again.choices[0].message.content)
            self.assertEqual(streamed, again.choices[0].message.content)
        finally:
            server.stop()


class QueueLimitTest(unittest.TestCase):
    def test_full_queue_answers_429(self):
        import openai
        server = Server("--queue-limit", "1")
        try:
            client = server.client()
            stream = client.chat.completions.create(model="smollm2", messages=parts("A part.", "Count to fifty."),
                                                    stream=True, temperature=0, max_tokens=400)
            next(iter(stream))  # the first request is in the engine
            with self.assertRaises(openai.RateLimitError) as e:
                client.chat.completions.create(model="smollm2", messages=parts("Another.", "Hi?"), max_tokens=2)
            self.assertEqual(e.exception.status_code, 429)
            self.assertEqual(e.exception.code, "queue_full")
            stream.close()
            deadline = time.time() + 60
            while True:  # the cancelled request leaves the engine at its next step
                try:
                    done = client.chat.completions.create(model="smollm2", messages=parts("Another.", "Hi?"),
                                                          max_tokens=2, temperature=0)
                    break
                except openai.RateLimitError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            self.assertEqual(done.usage.completion_tokens, 2)
        finally:
            server.stop()


class MemoryLimitTest(unittest.TestCase):
    def test_memory_tier_evicts_least_recently_used_chunks_and_stays_under_its_limit(self):
        limit = 3_000_000  # SmolLM2 keeps about 46 kB of KV per token: a few short parts
        server = Server("--memory-bytes", str(limit))
        try:
            client = server.client()
            ask = lambda *texts: client.chat.completions.create(model="smollm2", messages=parts(*texts),
                                                                max_tokens=2, temperature=0)
            ask(*KOSCIUSZKO, "Who named it?")
            again = ask(KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")
            self.assertGreaterEqual(kvfuse_usage(again)["loaded_tokens"], kvfuse_usage(again)["chunk_tokens"])
            ask(*PASSAGES, QUESTION)  # more parts than the limit holds: the least recently used go
            metrics = server.get("/metrics")[1]
            evicted = int(metrics.split("\nkvfuse_store_memory_evictions_total ")[1].split()[0])
            held = int(metrics.split("\nkvfuse_store_memory_bytes ")[1].split()[0])
            self.assertGreater(evicted, 0)
            self.assertLessEqual(held, limit)
            late = ask(KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")  # evicted parts are computed again
            self.assertLess(kvfuse_usage(late)["loaded_tokens"], kvfuse_usage(late)["chunk_tokens"])
            self.assertEqual(late.choices[0].finish_reason, "length")
        finally:
            server.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server on a free loopback port, without persistence."""

    def __init__(self):
        self.port = free_port()
        self.workdir = tempfile.mkdtemp(prefix="kvfuse-server-redis-")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.workdir], stdout=subprocess.DEVNULL)
        self.uri = f"redis://127.0.0.1:{self.port}"
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed")
class SharedRedisTest(unittest.TestCase):
    """Two kvfuse-server processes on one redis-server: one cache, and each survives the other and Redis."""

    def setUp(self):
        self.redis = Redis()
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.stop()
        self.redis.stop()

    def start_servers(self, n):
        self.servers = [Server("--store", self.redis.uri) for _ in range(n)]
        return self.servers

    @staticmethod
    def ask(server, *texts, max_tokens=2, **kw):
        return server.client().chat.completions.create(model="smollm2", messages=parts(*texts),
                                                       max_tokens=max_tokens, temperature=0, **kw)

    def test_chunk_computed_by_one_server_is_loaded_by_another(self):
        a, b = self.start_servers(2)
        first = self.ask(a, *KOSCIUSZKO, "Who named it?")
        second = self.ask(b, KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")
        self.assertEqual(kvfuse_usage(first)["loaded_tokens"], 0)
        self.assertGreaterEqual(kvfuse_usage(second)["loaded_tokens"], kvfuse_usage(second)["chunk_tokens"])
        metrics = b.get("/metrics")[1]
        self.assertIn('kvfuse_store_hits_total{tier="redis"} 2', metrics)  # both parts; b's memory tier had none
        self.assertIn('kvfuse_store_hits_total{tier="memory"} 0', metrics)

    def test_server_killed_mid_request_loses_only_that_request(self):
        import openai
        a, b = self.start_servers(2)
        self.ask(a, *KOSCIUSZKO, "Who named it?")  # a stores the chunk caches in Redis
        self.ask(b, *PASSAGES, QUESTION)  # b's survivor below loads these
        doomed = a.client().chat.completions.create(model="smollm2", messages=parts("A long story.", "Tell it."),
                                                    stream=True, temperature=0, max_tokens=400)
        survivor = b.client().chat.completions.create(model="smollm2", messages=parts(*PASSAGES, QUESTION),
                                                      stream=True, temperature=0, max_tokens=24)
        next(iter(doomed))
        text, finish = next(iter(survivor)).choices[0].delta.content or "", None
        a.proc.kill()  # SIGKILL: no clean-up of any kind
        a.proc.wait()
        with self.assertRaises((openai.APIConnectionError, openai.APIError)):
            for _ in doomed:
                pass
        for chunk in survivor:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        alone = self.ask(b, *PASSAGES, QUESTION, max_tokens=24)  # b's answer with nobody else around
        self.assertEqual(text, alone.choices[0].message.content)
        self.assertEqual(finish, alone.choices[0].finish_reason)
        again = self.ask(b, KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")  # what a stored before it died is there
        self.assertGreaterEqual(kvfuse_usage(again)["loaded_tokens"], kvfuse_usage(again)["chunk_tokens"])

    def test_redis_killed_mid_run_turns_reuse_into_compute(self):
        a, b = self.start_servers(2)
        self.ask(a, *KOSCIUSZKO, "Who named it?")  # in a's memory tier and in Redis
        running = a.client().chat.completions.create(model="smollm2", messages=parts(*PASSAGES, QUESTION),
                                                     stream=True, temperature=0, max_tokens=24)
        received = [next(iter(running))]
        self.redis.proc.kill()  # Redis dies while a request runs and its new chunk caches are being saved
        self.redis.proc.wait()
        received += list(running)
        finish = [c.choices[0].finish_reason for c in received if c.choices and c.choices[0].finish_reason]
        self.assertIn(finish[-1], ("stop", "length"))
        # b never saw the chunks and Redis is gone: computed, answered, no error.
        computed = self.ask(b, KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")
        self.assertEqual(computed.choices[0].finish_reason, "length")
        self.assertEqual(kvfuse_usage(computed)["loaded_tokens"], 0)
        self.assertEqual(kvfuse_usage(computed)["recomputed_tokens"], computed.usage.prompt_tokens)
        # a still has them in its memory tier: reuse goes on there.
        kept = self.ask(a, KOSCIUSZKO[1], KOSCIUSZKO[0], "Who named it?")
        self.assertGreaterEqual(kvfuse_usage(kept)["loaded_tokens"], kvfuse_usage(kept)["chunk_tokens"])
        # new chunks on both servers after Redis died: computed and answered.
        for s in (a, b):
            fresh = self.ask(s, "Uluru is a sandstone monolith in the Northern Territory.", "Where is Uluru?")
            self.assertEqual(fresh.choices[0].finish_reason, "length")
        self.assertEqual(json.loads(a.get("/health")[1])["status"], "ok")
        self.assertEqual(json.loads(b.get("/health")[1])["status"], "ok")


if __name__ == "__main__":
    if not BINARY or not os.path.exists(BINARY):
        skip(f"no kvfuse-server binary (KVFUSE_SERVER_BIN = '{BINARY}')")
    if os.environ.get("KVFUSE_SERVER_OPTIMIZED") == "0":
        skip("a Debug or sanitizer build (the real model takes minutes without optimization)")
    if not os.path.exists(MODEL):
        skip(f"no model at {MODEL} (scripts/fetch_model.sh; KVFUSE_MODEL overrides)")
    ensure_openai()
    unittest.main(verbosity=2)
