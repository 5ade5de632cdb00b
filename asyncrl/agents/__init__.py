"""Multi-turn episodes (agent loops): the interface, the built-in tool-calling episode, and the
tokenisation of environment text between turns. See docs/agents.md.

Typical use (a custom episode, `rollout.multi_turn.episode=my_pkg.env:episode`):
    async def episode(row, client, partial):
        ep = EpisodeBuilder.resume(client.prompt_ids, partial)
        turn = await client.generate([*client.prompt_ids, *ep.response_ids], max_tokens=64, prefix=ep.open_turn())
        ep.add_model(turn)
        ...  # ep.add_environment(ids) between turns
        return ep.trajectory(client.episode_id, turn.finish_reason)

Not here: the tools (`asyncrl.tools`), how the rollout server runs episodes (`asyncrl.workers.rollout_server`).
"""

from asyncrl.agents.episode import EngineClient, Episode, EpisodeBuilder, single_turn
from asyncrl.agents.messages import MessageTemplate
from asyncrl.agents.tool_episode import ToolEpisode

__all__ = ["EngineClient", "Episode", "EpisodeBuilder", "MessageTemplate", "ToolEpisode", "single_turn"]
