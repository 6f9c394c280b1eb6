"""A scripted OpenAI-compatible SSE server for the bench-serve tests: known
token timings, so the metrics bench-serve reports can be checked against
the truth.

Each streamed request sends max_tokens chunks of one token: the first after
`ttft_s` (every second request after `slow_ttft_s` instead, counted in
arrival order, the setup probe with its 4-token prompt not counted), the
rest `itl_s` apart; then a usage chunk when stream_options.include_usage
asks, then `data: [DONE]`.  `reject_stream_options` answers 400 naming
stream_options, as servers without it do.  Every request body, its headers
and its arrival time are recorded.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def is_probe(body):
    """bench-serve's setup request: a 4-token prompt (4 words as text)."""
    p = body.get("prompt")
    if p is None and body.get("messages"):
        p = body["messages"][0].get("content")
    if isinstance(p, str):
        p = p.split()
    return isinstance(p, list) and len(p) == 4


class FakeOpenAI:
    def __init__(self, port, ttft_s=0.2, slow_ttft_s=0.4, itl_s=0.05, model="fake-model",
                 reject_stream_options=False):
        self.ttft_s, self.slow_ttft_s, self.itl_s = ttft_s, slow_ttft_s, itl_s
        self.model, self.reject_stream_options = model, reject_stream_options
        self.lock = threading.Lock()
        self.requests = []  # (path, body, headers, arrival time)
        self.counted = 0
        self.sends = []  # (arrival, [chunk send times], probe)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/v1/models":
                    self.reply(200, {"object": "list", "data": [
                        {"id": fake.model, "object": "model", "owned_by": "test"}]})
                else:
                    self.reply(404, {"error": {"message": "no route"}})

            def reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                with fake.lock:
                    t = fake.accepted.get(self.client_address, time.monotonic())
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat = self.path == "/v1/chat/completions"
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    return self.reply(404, {"error": {"message": "no route"}})
                probe = is_probe(body)
                with fake.lock:
                    fake.requests.append((self.path, body, dict(self.headers), t))
                    slow = False
                    if not probe:
                        slow = fake.counted % 2 == 1
                        fake.counted += 1
                if fake.reject_stream_options and "stream_options" in body:
                    return self.reply(400, {"error": {
                        "message": "unrecognized request argument: stream_options",
                        "type": "invalid_request_error"}})
                n = int(body.get("max_tokens", 16))
                sent = []
                with fake.lock:
                    fake.sends.append((t, sent, probe))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                t0 = time.monotonic()
                due = t0 + (fake.slow_ttft_s if slow else fake.ttft_s)
                for i in range(n):
                    time.sleep(max(0.0, due - time.monotonic()))
                    due += fake.itl_s
                    if chat:
                        choice = {"index": 0, "delta": {"content": " tok%d" % i},
                                  "finish_reason": "length" if i == n - 1 else None}
                        ev = {"object": "chat.completion.chunk", "choices": [choice]}
                    else:
                        choice = {"index": 0, "text": " tok%d" % i,
                                  "finish_reason": "length" if i == n - 1 else None}
                        ev = {"object": "text_completion", "choices": [choice]}
                    self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    self.wfile.flush()
                    sent.append(time.monotonic())
                if (body.get("stream_options") or {}).get("include_usage"):
                    p = body.get("prompt")
                    pt = len(p) if isinstance(p, list) else 7
                    ev = {"choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": n,
                                                   "total_tokens": pt + n}}
                    self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            def process_request(self, request, client_address):
                # accepted: the request's clock starts here (before a thread
                # is started for it)
                with fake.lock:
                    fake.accepted[request.getpeername()] = time.monotonic()
                super().process_request(request, client_address)

        self.accepted = {}  # peer address -> accept time
        self.httpd = Server(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def bench_requests(self):
        """Recorded requests other than the setup probe."""
        with self.lock:
            return [r for r in self.requests if not is_probe(r[1])]

    def truth(self):
        """What the server really did, per bench request: ttft (ms from the
        connection's accept to its first chunk sent), gaps (ms between chunks
        sent), arrival and last (time.monotonic() seconds)."""
        with self.lock:
            out = []
            for t, sent, probe in self.sends:
                if probe or not sent:
                    continue
                out.append({"ttft": (sent[0] - t) * 1e3,
                            "gaps": [(b - a) * 1e3 for a, b in zip(sent, sent[1:])],
                            "arrival": t, "last": sent[-1]})
            return out

    def reset(self):
        with self.lock:
            self.requests, self.counted, self.sends = [], 0, []

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
