"""An OpenAI-compatible server with faults, for `bench/faults/run.sh`: debate replies by JSON schema;
per attempt 20% 429 (no Retry-After), 10% 503, 5% never answered (FAULTS=1), LATENCY_MS per
answered call, draws seeded by SEED; attempt counts on stdout every 5 s."""
import json, os, random, re, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

FAULTS = os.environ.get("FAULTS", "1") == "1"
LAT = float(os.environ.get("LATENCY_MS", "200")) / 1000
rng = random.Random(int(os.environ.get("SEED", "7")))
lock = threading.Lock()
counts = {"attempts": 0, "429": 0, "5xx": 0, "hang": 0}
answers = {}
for line in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "problems.jsonl")):
    if line.strip():
        v = json.loads(line); answers[v["problem"]] = v.get("reference", "0")

def reply_for(body):
    rf = body.get("response_format") or {}
    name = (rf.get("json_schema") or {}).get("name", "")
    prompt = " ".join(m.get("content", "") if isinstance(m.get("content"), str) else "" for m in body.get("messages", []))
    ans = next((a for q, a in answers.items() if q in prompt), "0")
    if name == "debate_solution":
        return {"approach": "direct", "reasoning_steps": ["work it out"], "final_answer": ans, "confidence": 0.7}
    if name == "debate_review":
        return {"strengths": ["clear"], "weaknesses": [], "errors": [], "suggested_changes": ["check"]}
    if name == "debate_refinement":
        return {"critiques_accepted": ["check"], "critiques_rejected": [], "refinement_reasoning": "checked",
                "reasoning_steps": ["checked"], "final_answer": ans, "confidence": 0.8,
                "changed_from_original": False, "improvement_explanation": "checked"}
    return {"reasoning": "solver_1 is right", "winner": "solver_1", "confidence": 0.9}

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send(200, {"data": [{"id": "m"}]})
    def send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); body = json.loads(self.rfile.read(n) or b"{}")
        with lock:
            counts["attempts"] += 1
            x = rng.random()
        if FAULTS:
            if x < 0.2:
                with lock: counts["429"] += 1
                return self.send(429, {"error": {"message": "rate limited"}})
            if x < 0.3:
                with lock: counts["5xx"] += 1
                return self.send(503, {"error": {"message": "unavailable"}})
            if x < 0.35:
                with lock: counts["hang"] += 1
                time.sleep(3600); return
        time.sleep(LAT)
        content = json.dumps(reply_for(body))
        self.send(200, {"id": "x", "object": "chat.completion", "model": body.get("model", "m"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}})

class S(ThreadingHTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", int(sys.argv[1])), H)
def report():
    while True:
        time.sleep(5)
        with lock: print(json.dumps(counts), flush=True)
threading.Thread(target=report, daemon=True).start()
s.serve_forever()
