"""`hrl doctor`: what a machine and a model need, checked before a run. `checks`: the machine (Docker, the vLLM
interpreter, the tool-call parser a model gets); `agents`: each agent CLI's install and redirect; `probe`: one
model's replies through the real proxy, per dialect."""
