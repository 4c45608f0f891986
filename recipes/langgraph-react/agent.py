"""A LangGraph ReAct agent (langgraph + langchain-openai) with a calculator tool, served through hrl's proxy.

`run(task, session)` is all hrl needs: the model client points at the session, the rest is plain LangGraph.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only integers with + - * are allowed")


@tool
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression such as `17 * 23`."""
    try:
        return str(_eval(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as e:
        return f"error: {e}"


async def run(task: Any, session: Any) -> float | None:
    llm = ChatOpenAI(model=session.model, base_url=session.base_url, api_key=session.api_key, max_tokens=48,
                     temperature=1.0, max_retries=0)  # fmt: skip
    agent = create_react_agent(llm, [calculator], prompt="You are a careful calculator. Use the calculator tool, "
                               "then reply with the number only.")  # fmt: skip
    try:
        await agent.ainvoke({"messages": [("user", task.problem_statement)]}, {"recursion_limit": 8})
    except GraphRecursionError:
        return 0.0  # looped on the tool without answering
    return None  # the recipe's verifier reads the last answer
