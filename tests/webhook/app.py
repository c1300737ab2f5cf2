"""A webhook bot as the README shows it, served by uvicorn for the webhook tests and benchmark.

``uvicorn app:app --app-dir tests/webhook --workers N``, configured by environment:

* ``CHATFLOW_WEBHOOK_DB``: the SQLite file every worker shares;
* ``CHATFLOW_WEBHOOK_STYLE``: which handler answers ``POST /webhook``
  (JSON ``{"phone": ..., "text": ..., "id": ...}``):

  - ``seed``: the seed's ``handle_inbound_webhook`` as written (``is_message_processed``,
    ``mark_message_processed``, then ``run_async``);
  - ``claim``: ``aclaim_message`` then ``run_async`` (a duplicate is acknowledged unanswered);
  - ``message_id``: one call, ``run_async(..., message_id=...)``;
  - ``idempotency``: ``run_async(..., idempotency_key=...)``;
  - ``agents_sdk``: the same bot on the OpenAI Agents SDK (``Runner.run`` with a
    ``SQLiteSession`` on a file beside the database; the SDK has no de-duplication), for the
    benchmark's comparison;
* ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: the model server (the fake server in tests).

Any exception is an HTTP 500, so the platform (the test driver) delivers the message again.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from chatflow_cli import Agent, Runner, SQLiteSessionStore, tool


@tool
def check_order_status(order_id: str) -> dict[str, str]:
    """Check shipment tracking for an order ID."""
    return {"order_id": order_id, "status": "IN_TRANSIT", "eta": "Tomorrow"}


agent = Agent(
    name="OrderTrackingAgent",
    instructions="Assist customers with order queries. Use check_order_status.",
    tools=[check_order_status],
    model="fake-model",
)
store = SQLiteSessionStore(db_path=os.environ["CHATFLOW_WEBHOOK_DB"], default_max_turns=30)
runner = Runner(starting_agent=agent, session_store=store)
STYLE = os.environ.get("CHATFLOW_WEBHOOK_STYLE", "seed")


async def handle_inbound_webhook(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
    # The seed's handler, as written.
    # 1. Proteção de deduplicação
    if store.is_message_processed(webhook_msg_id):
        print(f"Skipping duplicate webhook: {webhook_msg_id}")
        return None

    store.mark_message_processed(webhook_msg_id)

    # 2. Executar turno com sessão persistida
    response = await runner.run_async(
        session_id=user_phone,
        user_message=message_text,
        metadata={"channel": "whatsapp", "phone": user_phone},
    )
    return response.content


async def handle_with_claim(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
    if not await store.aclaim_message(webhook_msg_id):
        return None  # a duplicate: processed, or being processed by a live worker
    result = await runner.run_async(user_phone, message_text, metadata={"channel": "whatsapp"})
    return result.content


async def handle_with_message_id(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
    result = await runner.run_async(user_phone, message_text, message_id=webhook_msg_id)
    return result.content


async def handle_with_idempotency_key(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
    result = await runner.run_async(user_phone, message_text, idempotency_key=webhook_msg_id)
    return result.content


_sdk_bot: Any = None


async def handle_with_agents_sdk(user_phone: str, message_text: str, webhook_msg_id: str) -> Any:
    global _sdk_bot
    import agents
    from openai import AsyncOpenAI

    if _sdk_bot is None:
        agents.set_tracing_disabled(True)
        model = agents.OpenAIChatCompletionsModel(model="fake-model", openai_client=AsyncOpenAI())
        _sdk_bot = agents.Agent(name="OrderTrackingAgent", instructions="Assist customers with order queries.",
                                model=model, tools=[agents.function_tool(check_order_status.function)])
    session = agents.SQLiteSession(user_phone, os.environ["CHATFLOW_WEBHOOK_DB"] + ".sdk")
    result = await agents.Runner.run(_sdk_bot, message_text, session=session)
    return result.final_output


HANDLERS = {
    "seed": handle_inbound_webhook,
    "claim": handle_with_claim,
    "message_id": handle_with_message_id,
    "idempotency": handle_with_idempotency_key,
    "agents_sdk": handle_with_agents_sdk,
}


async def webhook(request: Request) -> JSONResponse:
    body = await request.json()
    content = await HANDLERS[STYLE](body["phone"], body["text"], body["id"])
    return JSONResponse({"content": content, "pid": os.getpid()})


app = Starlette(routes=[Route("/webhook", webhook, methods=["POST"])])
