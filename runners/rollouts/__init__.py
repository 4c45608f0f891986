"""Rollouts: the episodes a run asks for (`episodes`: one task under one harness, run many at once with a bound, an
episode that raises kept as an `internal_error` trace), how an agent CLI runs one in a fresh sandbox that reaches
only its proxy session and is scored by the task's verifier (`agent_session`, `rollout.AgentRollouts`), the mix of
harnesses that runs each episode under the one it names (`rollout.HarnessMix`), and a simulated agent for loop and
load tests (`simagent`). Runs get their rollouts through `runners.placement`."""
