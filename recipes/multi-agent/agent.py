"""A solver and a critic: the solver answers, an untrained critic (a child with trainable=False: recorded, never
trained on) reviews the answer, and the solver gets one more try with the critique. Plain `openai` SDK calls."""

from __future__ import annotations

from typing import Any

SOLVER = "You solve arithmetic. Reply with the number only."
CRITIC = "You check arithmetic. Reply OK if the answer is right, else say what is wrong."


async def run(task: Any, session: Any) -> float | None:
    client = session.openai(max_retries=0)
    messages = [{"role": "system", "content": SOLVER}, {"role": "user", "content": task.problem_statement}]
    answer = (await client.chat.completions.create(model=session.model, messages=messages, max_tokens=32)).choices[0]
    text = answer.message.content or ""
    async with session.child("critic", trainable=False) as critic:
        review = [{"role": "system", "content": CRITIC},
                  {"role": "user", "content": f"Question: {task.problem_statement}\nAnswer: {text}"}]  # fmt: skip
        reply = await critic.openai(max_retries=0).chat.completions.create(model=critic.model, messages=review,
                                                                          max_tokens=32)  # fmt: skip
        critique = reply.choices[0].message.content or ""
    if not critique.strip().upper().startswith("OK"):
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": f"A reviewer says: {critique}\nTry again: the number only."}]  # fmt: skip
        await client.chat.completions.create(model=session.model, messages=messages, max_tokens=32)
    return None  # the recipe's verifier reads the solver's last answer
