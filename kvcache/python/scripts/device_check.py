"""Helper of device-check.sh: makes the random model, runs one vLLM pass, reports."""

import json
import sys
import time
from pathlib import Path

PROMPT_TOKENS = 8192
GEN_TOKENS = 32


def make_model(path: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=16384,
                      torch_dtype="bfloat16")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    # A word-level tokenizer over "w0".."w4093": every prompt word is one token.
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(cfg.vocab_size - 3)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)


def run(model: str, mode: str, addr: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if mode != "plain":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="StrataConnector", kv_connector_module_path="strata_kv.vllm", kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"strata_addr": addr, "namespace": "device-check", "revision": "random-0"})
    # Prefix caching off: a warm run's hit can only come from Strata.
    llm = LLM(model=model, enable_prefix_caching=False, max_model_len=PROMPT_TOKENS + GEN_TOKENS + 16,
              gpu_memory_utilization=0.5, **kw)
    prompt = " ".join(f"w{(i * 7919) % 4000}" for i in range(PROMPT_TOKENS))
    t0 = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    ttft = time.perf_counter() - t0
    out = llm.generate([prompt + " w1"], SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0))
    print(json.dumps({"mode": mode, "ttft_s": ttft, "tokens": list(out[0].outputs[0].token_ids)}))


def report(out_dir: str) -> None:
    runs = {m: json.loads(Path(out_dir, f"{m}.json").read_text()) for m in ("plain", "strata-cold", "strata-warm")}
    toks = [r["tokens"] for r in runs.values()]
    print(json.dumps({
        "ttft_plain_s": runs["plain"]["ttft_s"],
        "ttft_strata_cold_s": runs["strata-cold"]["ttft_s"],
        "ttft_strata_warm_s": runs["strata-warm"]["ttft_s"],
        "warm_over_plain": runs["strata-warm"]["ttft_s"] / runs["plain"]["ttft_s"],
        "tokens_identical": all(t == toks[0] for t in toks),
        "prompt_tokens": PROMPT_TOKENS,
    }, indent=1))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make-model":
        make_model(sys.argv[2])
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "report":
        report(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
