"""Tool choice among 8 tools plus arguments: pcd's scored decision against the model writing the call.

For each of 8 requests (one per tool), in one run on the same model:

* ``pcd``: :func:`pcd_engine.tool_calls.decide_tools` with ``choice="required"``: the tool is one closed question
  decided in one pass, then the chosen tool's arguments are filled as its schema;
* ``AR``: the same model writes the call token by token (greedy), the way a chat model without constrained
  decoding does: the tools are listed as JSON in the system turn (the model's own ``apply_chat_template(tools=...)``
  when its template takes tools, else a plain listing), and the reply must be one JSON object
  ``{"name": ..., "arguments": {...}}``.

A call is valid when it names a real tool and its arguments validate against that tool's JSON Schema. Reported:
median ms per request, forward passes per request, valid-call rate, and how often the expected tool was chosen.

Usage::

    python benchmarks/bench_tools.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jsonschema  # noqa: E402

from pcd_engine import ChatMessage, Engine  # noqa: E402
from pcd_engine.generate.free_text import chat_prompt_ids  # noqa: E402
from pcd_engine.tool_calls import Tool, decide_tools  # noqa: E402
from pcd_engine.tools.baseline import json_object_closed  # noqa: E402


def _obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


ORDER = {"type": "string", "description": "The order number"}
TOOLS = [
    Tool("get_order_status", "Look up where an order is and when it arrives.", _obj(order_id=ORDER)),
    Tool(
        "refund",
        "Refund money for an order.",
        _obj(order_id=ORDER, amount={"type": "integer", "minimum": 0, "maximum": 1000}),
    ),
    Tool(
        "cancel_order",
        "Cancel an order that has not shipped.",
        _obj(order_id=ORDER, reason={"enum": ["changed_mind", "too_slow", "wrong_item", "other"]}),
    ),
    Tool(
        "update_address",
        "Change the delivery address of an order.",
        _obj(order_id=ORDER, address={"type": "string", "maxLength": 80}),
    ),
    Tool("apply_coupon", "Apply a discount code to an order.", _obj(order_id=ORDER, code={"type": "string"})),
    Tool(
        "contact_human",
        "Hand the conversation to a human agent.",
        _obj(topic={"enum": ["billing", "delivery", "complaint", "other"]}),
    ),
    Tool("check_stock", "Check whether a product is in stock.", _obj(product={"type": "string", "maxLength": 40})),
    Tool("reset_password", "Send a password reset link to the customer's email.", _obj(email={"type": "string"})),
]
REQUESTS = [
    ("Where is my order 5521? It still has not arrived.", "get_order_status"),
    ("I was charged 40 dollars twice for order 7781, please give me my 40 back.", "refund"),
    ("Please cancel order 3310, it is taking far too long.", "cancel_order"),
    ("I moved: send order 9023 to 12 Rose Street, Leeds instead.", "update_address"),
    ("Can you apply the code SPRING10 to my order 4410?", "apply_coupon"),
    ("I want to talk to a real person about my bill.", "contact_human"),
    ("Do you have the blue running shoes in stock?", "check_stock"),
    ("I forgot my password, my email is ann@example.com.", "reset_password"),
]


def valid_call(name: Any, arguments: Any) -> bool:
    """The call names a real tool and its arguments validate against that tool's schema."""
    tool = next((t for t in TOOLS if t.name == name), None)
    if tool is None or not isinstance(arguments, dict):
        return False
    return jsonschema.Draft202012Validator(dict(tool.parameters)).is_valid(arguments)


def ar_prompt(engine: Engine, text: str) -> list[int]:
    """The prompt a chat model gets when it writes the call itself."""
    specs = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": dict(t.parameters)}} for t in TOOLS]  # fmt: skip
    hf = engine.tokenizer.hf
    try:
        rendered = hf.apply_chat_template(
            [{"role": "user", "content": text}], tools=specs, tokenize=False, add_generation_prompt=True
        )
        if "get_order_status" in rendered:  # the template really takes tools
            return list(engine.tokenizer.encode(rendered)) + engine.tokenizer.encode("{")
    except Exception:  # noqa: BLE001 - a template without tool support: list them in the system turn instead
        pass
    system = (
        "You can call one of these tools:\n"
        + "\n".join(json.dumps(s["function"]) for s in specs)
        + '\nReply with one JSON object {"name": <tool name>, "arguments": {...}} and nothing else.'
    )
    turns = [ChatMessage("system", system), ChatMessage("user", text)]
    return chat_prompt_ids(engine.tokenizer, turns) + engine.tokenizer.encode("{")


def run_ar(engine: Engine, text: str, limit: int) -> tuple[float, int, Any, Any]:
    ids = ar_prompt(engine, text)
    started = time.perf_counter()
    out = engine.backend.generate_greedy(
        ids, max_new_tokens=limit, stop=lambda toks: json_object_closed("{" + engine.tokenizer.decode(toks))
    )
    ms = (time.perf_counter() - started) * 1000
    written = "{" + engine.tokenizer.decode(out)
    try:
        call = json.loads(written[: written.rindex("}") + 1])
    except ValueError:
        call = {}
    call = call if isinstance(call, dict) else {}
    return ms, len(out), call.get("name"), call.get("arguments")


def run_pcd(engine: Engine, text: str) -> tuple[float, int, Any, Any]:
    before = engine.backend.forward_passes
    started = time.perf_counter()
    decision = decide_tools(engine, text, TOOLS, choice="required")
    ms = (time.perf_counter() - started) * 1000
    call = decision.calls[0]
    return ms, engine.backend.forward_passes - before, call.name, call.arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="alias, folder or repo id (default: embedded SmolLM2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=96, help="AR token limit per call")
    args = parser.parse_args(argv)
    engine = Engine.load(args.model)
    for text, _ in REQUESTS:  # warm the heads and grammars of every tool
        run_pcd(engine, text)
    rows = []
    for method in ("pcd", "AR"):
        times, passes, valid, right = [], [], 0, 0
        for text, expected in REQUESTS:
            runs = [run_pcd(engine, text) if method == "pcd" else run_ar(engine, text, args.limit)
                    for _ in range(args.repeats)]  # fmt: skip
            times.append(statistics.median(r[0] for r in runs))
            ms, n, name, arguments = runs[0]
            passes.append(n)
            valid += valid_call(name, arguments)
            right += name == expected
        rows.append((method, statistics.median(times), statistics.mean(passes), valid, right))
    print(f"model: {args.model or 'SmolLM2-135M-Instruct (embedded)'}; {len(REQUESTS)} requests, 8 tools; "
          f"medians of {args.repeats}\n")  # fmt: skip
    print("| method | ms per request (median) | forward passes per request | valid calls | expected tool |")
    print("|---|---|---|---|---|")
    for method, ms, n, valid, right in rows:
        print(f"| {method} | {ms:.0f} | {n:.1f} | {valid}/{len(REQUESTS)} | {right}/{len(REQUESTS)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
