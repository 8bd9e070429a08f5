#!/usr/bin/env python3
"""A real vLLM engine generating through ferry on GPUs: prefill (kv_producer) and decode
(kv_consumer) engines hand off through one ferryd, and the decode engine's greedy tokens
are checked against a plain engine's, in both placements a node has: both engines on
GPU0, and prefill on GPU0 with decode on GPU1.

    PYTHONPATH=SITE:.gpu-python python3 tests/gpu/vllm_engine.py --ferryd=BUNDLE/bin/ferryd

SITE holds vLLM (a release whose torch pin is the host's: 0.26 for torch 2.11) and what
its offline engine imports; ferry's client comes from tests/gpu/python_bundle.sh.

The model is a tiny Llama (4 layers, 4 KV heads of 64) with random-normal weights written
here with a fixed seed: unlike load_format="dummy"'s tiny uniform weights, they make the
next token depend on the KV cache, so a wrong block shows in the tokens. Prompts are token
ids (no tokenizer) of many lengths, block-aligned and not, and two that share a long
prefix with an earlier one (the decode engine has those blocks cached and pulls only the
rest). Where either engine's own top two logprobs are within TIE of each other, bf16
rounding may pick either (a K/V entry computed in a batch of one token rounds apart from
the same entry computed in a chunk of 80): such a first difference is reported, with both
margins, not failed.

Each engine runs in a process of its own (as pods do), stepped by vLLM itself; this
script sends it prompts as JSON lines. Prints one line per prompt and placement, the
timing rows (the plain engine's prefill, the decode engine's time to its first token,
which includes the handoff), and PASS or FAIL.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 4, 512, 8, 4, 64, 1024, 32000
MAX_LEN, NEW_TOKENS, TIE = 2048, 16, 0.02
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_model(path: str) -> None:
    import torch
    from safetensors.torch import save_file

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
              "max_position_embeddings": MAX_LEN, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    g = torch.Generator().manual_seed(0)

    def w(*shape, std=0.05):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)
    t = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, std=1.0), "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
         "lm_head.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
                  p + "mlp.gate_proj.weight": w(INTER, HIDDEN), p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                  p + "mlp.down_proj.weight": w(HIDDEN, INTER),
                  p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)})
    save_file(t, os.path.join(path, "model.safetensors"))


def serve(args) -> int:
    """One engine: reads {"prompt", "max_tokens", "params"} lines, answers with its tokens,
    top-two logprob margins, kv_transfer_params, finish reason and seconds."""
    # Answers go to the original stdout; everything else written to fd 1 (vLLM's logs, its
    # engine process's) to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = None
    if args.role != "plain":
        kv = KVTransferConfig(kv_connector="FerryConnector", kv_connector_module_path="ferry.vllm",
                              kv_role=f"kv_{args.role}", engine_id=f"{args.role}-0",
                              kv_connector_extra_config={"socket": args.socket})
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=not args.cuda_graphs, seed=0,
              gpu_memory_utilization=0.25, max_model_len=MAX_LEN, enable_prefix_caching=True,
              kv_transfer_config=kv)
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        extra = {"kv_transfer_params": req["params"]} if req.get("params") is not None else None
        sp = SamplingParams(max_tokens=req["max_tokens"], temperature=0.0, logprobs=2, detokenize=False,
                            extra_args=extra)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=req["prompt"])], sp, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        c = out.outputs[0]
        margins = []
        for lp in c.logprobs or []:
            top = sorted((v.logprob for v in lp.values()), reverse=True)
            margins.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        print(json.dumps({"tokens": list(c.token_ids), "margins": margins, "params": out.kv_transfer_params,
                          "finish": str(c.finish_reason), "seconds": seconds}), file=answers, flush=True)
    return 0


class Engine:
    """An engine process (serve) on one GPU."""

    def __init__(self, role, device, model, socket, log, cuda_graphs=False):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(device), **ENV)
        self.role, self.log = role, log
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", f"--role={role}",
                                      f"--model={model}", f"--socket={socket}"] +
                                     (["--cuda_graphs"] if cuda_graphs else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=env)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"the {role} engine did not start; the end of {log}:\n{tail(log)}")

    def ask(self, prompt, max_tokens, params=None) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "params": params}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.role} engine ended; the end of {self.log}:\n{tail(self.log)}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tail(path, n=40):
    with open(path) as f:
        return "".join(f.readlines()[-n:])


def compare(plain: dict, got: dict) -> str:
    """"same", "tie at N" (the first difference where either engine's top two are within
    TIE of each other: bf16 rounding of the same sums in other batch shapes picks either),
    or "DIFFERENT at N"."""
    a, b = plain["tokens"], got["tokens"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            if min(plain["margins"][i], got["margins"][i]) < TIE:  # either engine's own choice is a tie
                return (f"tie at {i} (top-two logprob margins there: plain {plain['margins'][i]:.3f}, "
                        f"this engine {got['margins'][i]:.3f})")
            return (f"DIFFERENT at {i} (top-two logprob margins there: plain {plain['margins'][i]:.3f}, "
                    f"this engine {got['margins'][i]:.3f})")
    return "same" if len(a) == len(b) else f"DIFFERENT length {len(b)}"


def moved_bytes(metrics_port: int) -> float:
    """Bytes the agent has written node-locally (ferry_transfer_bytes_total, tx, local)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^ferry_transfer_bytes_total\{(?=[^}]*direction="tx")(?=[^}]*path="local")[^}]*\} (\S+)$', text, re.M))


def orchestrate(args) -> int:
    import torch

    work = tempfile.mkdtemp(prefix="fy.vllm.", dir="/tmp")
    model = os.path.join(work, "model")
    os.mkdir(model)
    write_model(model)
    sock = os.path.join(work, "a.sock")
    agent = subprocess.Popen([args.ferryd, f"--socket={sock}", "--metrics_address=127.0.0.1:0",
                              f"--ready_file={work}/a.ready", "--log_level=warning"],
                             stderr=open(os.path.join(work, "ferryd.log"), "w"),
                             env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(os.path.dirname(args.ferryd), "../lib")))
    rng = random.Random(7)
    def prompt(n):
        return [rng.randrange(3, VOCAB) for _ in range(n)]
    prompts = [prompt(n) for n in (17, 97, 256, 500, 1000, 1500)]
    prompts.append(prompts[4][:320] + prompt(80))  # 20 blocks cached on the decode side
    prompts.append(prompts[5][:1488] + prompt(9))  # all but the last block cached
    timed = {n: [prompt(n) for _ in range(3)] for n in (256, 1024, 2000)}
    ok = True
    try:
        for _ in range(200):
            if os.path.exists(f"{work}/a.ready"):
                break
            time.sleep(0.1)
        ready = dict(line.strip().split("=", 1) for line in open(f"{work}/a.ready") if "=" in line)
        metrics_port = int(ready["metrics_port"])
        plain = Engine("plain", 0, model, sock, os.path.join(work, "plain.log"), args.cuda_graphs)
        want = [plain.ask(p, NEW_TOKENS) for p in prompts]
        prefill = {n: sorted(plain.ask(p, 1)["seconds"] for p in ps)[1] for n, ps in timed.items()}
        plain.close()
        placements = [("same GPU", 0, 0)] + ([("GPU0 -> GPU1", 0, 1)] if torch.cuda.device_count() > 1 else [])
        for name, pdev, cdev in placements:
            prod = Engine("producer", pdev, model, sock, os.path.join(work, f"producer{pdev}{cdev}.log"), args.cuda_graphs)
            cons = Engine("consumer", cdev, model, sock, os.path.join(work, f"consumer{pdev}{cdev}.log"), args.cuda_graphs)
            try:
                before = moved_bytes(metrics_port)
                for i, p in enumerate(prompts):
                    held = prod.ask(p, 1, {"do_remote_decode": True})
                    got = cons.ask(p, NEW_TOKENS, held["params"])
                    verdict = compare(want[i], got) if got["finish"] != "error" else "ERROR"
                    ok &= not verdict.startswith(("DIFFERENT", "ERROR"))
                    print(f"{name}: prompt {i} ({len(p)} tokens): {verdict}; decode {got['finish']}", flush=True)
                # Every block not cached on the decode side came through the agent (64 KiB a
                # block: 4 layers x K and V of 16 tokens x 4 heads x 64 x bf16), none recomputed.
                cached = 320 // 16 + 1488 // 16
                expect = (sum(-(-len(p) // 16) for p in prompts) - cached) * 64 * 1024
                moved = moved_bytes(metrics_port) - before
                ok &= moved >= expect
                print(f"{name}: the agent moved {moved / 2**20:.2f} MiB of KV, {expect / 2**20:.2f} MiB expected", flush=True)
                print(f"# {name}: tokens  plain prefill_ms  decode ttft_ms (incl. handoff)  ratio", flush=True)
                for n, ps in timed.items():
                    ttft = []
                    for p in ps:
                        held = prod.ask(p, 1, {"do_remote_decode": True})
                        got = cons.ask(p, 1, held["params"])
                        ok &= got["finish"] != "error"
                        ttft.append(got["seconds"])
                    t = sorted(ttft)[1]
                    print(f"{name}: {n} {prefill[n] * 1e3:.1f} {t * 1e3:.1f} {t / prefill[n]:.2f}", flush=True)
            finally:
                prod.close()
                cons.close()
    finally:
        agent.terminate()
        agent.wait(15)
        if args.logs:
            subprocess.run(["cp", "-r", work, args.logs], check=False)
    print("vllm_engine:", "PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["orchestrate", "serve"], nargs="?", default="orchestrate")
    p.add_argument("--ferryd", default=".gpu-bundle/bin/ferryd")
    p.add_argument("--logs", default="", help="copy the engines' and the agent's logs here")
    p.add_argument("--role", choices=["plain", "producer", "consumer"])
    p.add_argument("--model")
    p.add_argument("--cuda_graphs", action="store_true", help="engines with CUDA graphs (default: enforce_eager)")
    p.add_argument("--socket")
    args = p.parse_args()
    return serve(args) if args.mode == "serve" else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
