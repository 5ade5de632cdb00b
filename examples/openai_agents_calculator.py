"""An agent written with the OpenAI Agents SDK, trained unchanged by asyncrl (docs/agents.md).

    asyncrl train model.path=tiny-tools data.task=long_addition rollout.multi_turn.format=compact \
        rollout.agent.entrypoint=examples/openai_agents_calculator.py:agent

Nothing here imports asyncrl: `client` is an `openai.AsyncOpenAI` bound to this episode's
endpoint; the SDK talks chat completions to it (`OpenAIChatCompletionsModel`, as for any endpoint
that is not OpenAI's), with its trace export off. Returning None lets the run's reward function
score the conversation's last answer; return a float (or a dict of terms) to score it yourself.
"""

import ast
import operator

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only integers with + - *")


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an integer expression with + - *."""
    try:
        return str(_eval(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as exc:
        return f"error: {exc}"


async def agent(row, client):
    question = row["prompt"][-1]["content"]
    bot = Agent(name="calculator", tools=[calculator],
                model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
    await Runner.run(bot, question)
    return None
