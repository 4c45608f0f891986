"""The HTTP face of `hrl serve --tinker`: the routes the official Tinker SDK calls (`tinker.ServiceClient`,
`TrainingClient`, `SamplingClient`), answered with the SDK's own pydantic types (JSON) or protobuf messages (`wire`).

Every route needs a client key of the keys file (`hrl keys add NAME --keys-file F`), sent by the SDK as its API key
`tml-<key>` in `X-API-Key` (the SDK refuses a key without that prefix; it is taken off here): a wrong one is a 401.
A key sees only its own sessions, models, samplers and futures (404 for another's). A route the SDK has and hrl
does not serve answers 400 naming it, which the SDK raises at once (it retries 5xx for minutes, 400 never)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError
from tinker import types

from hrl.runners.errors import ClientError
from hrl.runners.online.keys import ClientKeys
from hrl.runners.tinker.checkpoints import checkpoint_dir
from hrl.runners.tinker.futures import Failed, Futures, Outcome, Proto
from hrl.runners.tinker.sampling import Samplers
from hrl.runners.tinker.service import LOSSES, TinkerService
from hrl.runners.tinker.wire import decode_forward_backward, encode_forward_backward_output, encode_sample_response

__all__ = ["API_KEY_PREFIX", "build_app"]

API_KEY_PREFIX = "tml-"  # the SDK's ApiKeyAuthProvider refuses any other; hrl's key K is sent as tml-K
_PROTO = "application/x-protobuf"
Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]  # (request, the client key's name)


def _json(model: BaseModel | dict[str, Any]) -> web.Response:
    return web.json_response(
        model.model_dump(mode="json", exclude_none=True) if isinstance(model, BaseModel) else model
    )


async def _body(request: web.Request, cls: type[Any]) -> Any:
    """The request's JSON as the SDK type `cls`; 400 naming what is wrong."""
    try:
        return cls.model_validate(json.loads(await request.read() or b"{}"))
    except (ValueError, ValidationError) as e:
        raise ClientError(400, f"{request.path}: not a valid {cls.__name__}: {e}") from None


class TinkerApp:
    """The routes, over the service (training), the samplers and the futures."""

    def __init__(self, service: TinkerService, samplers: Samplers, keys: ClientKeys, max_context: int) -> None:
        self.service, self.samplers, self.keys = service, samplers, keys
        self.futures = Futures()
        self.max_context = max_context

    def owner(self, request: web.Request) -> str:
        """The name of the client key the request carries; ClientError 401 for none or a wrong one."""
        key = request.headers.get("X-API-Key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        name = self.keys.name_for(key.removeprefix(API_KEY_PREFIX)) if key else None
        if name is None:
            raise ClientError(401, "no valid client key: pass api_key='tml-<key>' to tinker.ServiceClient (or set "
                                   "TINKER_API_KEY), with a key of `hrl keys add NAME --keys-file F`")  # fmt: skip
        return name

    # ---- session and configuration --------------------------------------------------------------------------------
    async def client_config(self, request: web.Request, owner: str) -> web.Response:
        # plain httpx transport, per-request retrieve_future polling, no server-side custom losses or JWTs
        return _json(types.ClientConfigResponse(use_pyqwest_transport=False, sample_use_retrieve_futures=False))

    async def dynamic_config(self, request: web.Request, owner: str) -> web.Response:
        return _json(types.ClientDynamicConfigResponse(refresh_interval_sec=3600))

    async def capabilities(self, request: web.Request, owner: str) -> web.Response:
        model = types.SupportedModel(model_name=self.service.name, max_context_length=self.max_context,
                                     trainable=True, sampleable=True)  # fmt: skip
        return _json(types.GetServerCapabilitiesResponse(supported_models=[model]))

    async def create_session(self, request: web.Request, owner: str) -> web.Response:
        await _body(request, types.CreateSessionRequest)
        session = self.service.create_session(owner)
        return _json(types.CreateSessionResponse(session_id=session.session_id))

    async def heartbeat(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.SessionHeartbeatRequest)
        self.service.session(owner, body.session_id)
        return _json(types.SessionHeartbeatResponse())

    async def finish(self, request: web.Request, owner: str) -> web.Response:
        self.service.finish(owner, request.match_info["session_id"])
        return _json({})

    # ---- training -------------------------------------------------------------------------------------------------
    async def create_model(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.CreateModelRequest)
        self.service.check_base(body.base_model)
        if body.optimizer_config.type != "adamw":
            raise ClientError(400, f"optimizer {body.optimizer_config.type!r}: hrl trains with AdamW (adamw) only")
        model = self.service.new_model(owner, body.session_id, body.model_seq_id, body.lora_config or
                                       types.LoraConfig(rank=32))  # fmt: skip

        async def build() -> Outcome:
            await self.service.build(model)
            return types.CreateModelResponse(model_id=model.model_id).model_dump(mode="json")

        return self._future(owner, build(), model.model_id)

    async def get_info(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.GetInfoRequest)
        return _json(self.service.info(self.service.model(owner, body.model_id)))

    async def forward_backward(self, request: web.Request, owner: str) -> web.Response:
        if request.headers.get("Content-Encoding", "identity") != "identity":
            raise ClientError(400, "forward_backward: compressed bodies are not taken (client config says so)")
        fb, forward_only = decode_forward_backward(await request.read())
        loss = fb.forward_backward_input.loss_fn
        if loss not in LOSSES:
            raise ClientError(400, f"loss_fn {loss!r} is not supported by hrl serve --tinker; it computes "
                                   f"{', '.join(LOSSES)} (docs/tinker.md)")  # fmt: skip
        model = self.service.model(owner, fb.model_id)
        config = dict(fb.forward_backward_input.loss_fn_config or {})
        data = list(fb.forward_backward_input.data)

        async def run() -> Outcome:
            outputs, metrics = await self.service.run(model, lambda t: t.forward_backward(data, loss, config,
                                                                                           forward_only))  # fmt: skip
            return Proto(encode_forward_backward_output(outputs, metrics))

        return self._future(owner, run(), model.model_id)

    async def optim_step(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.OptimStepRequest)
        if not isinstance(body.optim_params, types.AdamParams):
            raise ClientError(400, "optim_step: hrl takes AdamParams only (no Dimuon)")
        model, params = self.service.model(owner, body.model_id), body.optim_params

        async def run() -> Outcome:
            metrics = await self.service.run(model, lambda t: t.optim_step(params))
            return types.OptimStepResponse(metrics=metrics).model_dump(mode="json")

        return self._future(owner, run(), model.model_id)

    async def save_weights(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.SaveWeightsRequest)
        model = self.service.model(owner, body.model_id)

        async def run() -> Outcome:
            path, _ = await self.service.save(model, "weights", body.path, optimizer=True)
            return types.SaveWeightsResponse(path=path).model_dump(mode="json")

        return self._future(owner, run(), model.model_id)

    async def load_weights(self, request: web.Request, owner: str) -> web.Response:
        """Onto an existing model (`model_id`), or as a new model's first request (`session_id`, `model_seq_id`)."""
        body = await _body(request, types.LoadWeightsRequest)
        folder, lora = self.service.state(body.path)
        if body.model_id is not None:
            model = self.service.model(owner, body.model_id)
            work = self.service.run(model, lambda t: t.load(folder, body.optimizer))
        elif body.session_id is not None and body.model_seq_id is not None:
            self.service.check_base(body.base_model)
            model = self.service.new_model(owner, body.session_id, body.model_seq_id, lora)
            work = self.service.build(model, folder, body.optimizer)
        else:
            raise ClientError(400, "load_weights: give model_id, or session_id and model_seq_id")

        async def run() -> Outcome:
            await work
            return types.LoadWeightsResponse(path=body.path, model_id=model.model_id).model_dump(mode="json")

        return self._future(owner, run(), model.model_id)

    # ---- sampling -------------------------------------------------------------------------------------------------
    async def save_for_sampler(self, request: web.Request, owner: str) -> web.Response:
        """A named sampler checkpoint (its path back), or an unnamed one opened as sampling session
        `<session>:sample:<sampling_session_seq_id>` (its id back). `inflight` is served as `snapshot`."""
        body = await _body(request, types.SaveWeightsForSamplerRequest)
        model = self.service.model(owner, body.model_id)
        if body.path is None and body.sampling_session_seq_id is None:
            raise ClientError(400, "save_weights_for_sampler: give path or sampling_session_seq_id")

        async def run() -> Outcome:
            path, folder = await self.service.save(model, "sampler_weights", body.path, optimizer=False)
            if body.path is not None:
                return types.SaveWeightsForSamplerResponseInternal(path=path).model_dump(mode="json")
            sid = f"{model.session.session_id}:sample:{body.sampling_session_seq_id}"
            await self.samplers.open(owner, sid, path, folder)
            return types.SaveWeightsForSamplerResponseInternal(path=path, sampling_session_id=sid).model_dump(
                mode="json"
            )

        return self._future(owner, run(), model.model_id)

    async def create_sampling_session(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.CreateSamplingSessionRequest)
        session = self.service.session(owner, body.session_id)
        self.service.check_base(body.base_model)
        adapter = None if body.model_path is None else checkpoint_dir(self.service.checkpoints, body.model_path)
        sid = f"{session.session_id}:sample:{body.sampling_session_seq_id}"
        await self.samplers.open(owner, sid, body.model_path, adapter)
        return _json(types.CreateSamplingSessionResponse(sampling_session_id=sid))

    async def get_sampler(self, request: web.Request, owner: str) -> web.Response:
        sampler = self.samplers.get(owner, request.match_info["sampler_id"])
        return _json(types.GetSamplerResponse(sampler_id=sampler.sampler_id, base_model=self.service.name,
                                              model_path=sampler.model_path))  # fmt: skip

    async def asample(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.SampleRequest)
        if body.sampling_session_id is None:
            raise ClientError(400, "sample: hrl samples in sampling sessions only (create_sampling_client first)")
        asked = [n for n, on in (("topk_prompt_logprobs", body.topk_prompt_logprobs),
                 ("topk_sample_logprobs", body.topk_sample_logprobs),
                 ("target_prompt_logprobs", body.target_prompt_logprobs), ("prompt_alt_tokens_k",
                 body.prompt_alt_tokens_k), ("record_stability_info", body.record_stability_info)) if on]  # fmt: skip
        if asked:
            raise ClientError(400, f"sample: {', '.join(asked)} not supported by hrl serve --tinker (docs/tinker.md)")
        sampler = self.samplers.get(owner, body.sampling_session_id)
        if any(not isinstance(c, types.EncodedTextChunk) for c in body.prompt.chunks):
            raise ClientError(400, "sample: hrl samples from token prompts only (no image chunks)")
        prompt = body.prompt.to_ints()
        if body.prompt_logprobs_last_n is not None and not 1 <= body.prompt_logprobs_last_n < len(prompt):
            raise ClientError(400, f"prompt_logprobs_last_n must be 1 … {len(prompt) - 1} (len(prompt) - 1)")
        group = f"{sampler.sampler_id}:{body.seq_id}"  # the request's samples: one GRPO-style group of traces

        async def run() -> Outcome:
            scored = None
            if body.prompt_logprobs:  # first: scoring makes the sampler's weights the engine's live ones
                scored = await self.samplers.prompt_logprobs(sampler, prompt, body.prompt_logprobs_last_n)
            return Proto(encode_sample_response(await self.samplers.sample(sampler, body, group), scored))

        ids = [f"{group}:{i}" for i in range(body.num_samples)]
        return _json(types.UntypedAPIFuture(request_id=self.futures.submit(owner, run()), sample_sequence_ids=ids))

    # ---- futures --------------------------------------------------------------------------------------------------
    def _future(self, owner: str, work: Awaitable[Outcome], model_id: str | None = None) -> web.Response:
        return _json(types.UntypedAPIFuture(request_id=self.futures.submit(owner, work), model_id=model_id))

    async def retrieve(self, request: web.Request, owner: str) -> web.Response:
        body = await _body(request, types.FutureRetrieveRequest)
        outcome = await self.futures.retrieve(owner, body.request_id)
        if outcome is None:
            return _json(types.TryAgainResponse(request_id=body.request_id, queue_state="active"))
        if isinstance(outcome, Proto):
            return web.Response(body=outcome.body, content_type=_PROTO)
        if isinstance(outcome, Failed):
            return _json(types.RequestFailedResponse(error=outcome.error, category=outcome.category))  # type: ignore[arg-type]
        return _json(outcome)

    async def cancel(self, request: web.Request, owner: str) -> web.Response:
        self.futures.cancel(owner, str(json.loads(await request.read() or b"{}").get("request_id", "")))
        return _json({})

    async def telemetry(self, request: web.Request, owner: str) -> web.Response:
        return _json(types.TelemetryResponse(status="accepted"))  # the SDK's own telemetry: taken, not kept

    async def unsupported(self, request: web.Request, owner: str) -> web.Response:
        raise ClientError(400, f"{request.method} {request.path} is not supported by hrl serve --tinker "
                               "(docs/tinker.md lists the calls it serves)")  # fmt: skip


def build_app(service: TinkerService, samplers: Samplers, keys: ClientKeys, max_context: int) -> web.Application:
    """The Tinker API over `service` and `samplers`, for the client keys in `keys`."""
    api = TinkerApp(service, samplers, keys, max_context)
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "client/config", api.client_config), ("POST", "client/dynamic_config", api.dynamic_config),
        ("GET", "get_server_capabilities", api.capabilities), ("POST", "create_session", api.create_session),
        ("POST", "session_heartbeat", api.heartbeat), ("POST", "sessions/{session_id}/finish", api.finish),
        ("POST", "create_model", api.create_model), ("POST", "get_info", api.get_info),
        ("POST", "forward_backward", api.forward_backward), ("POST", "optim_step", api.optim_step),
        ("POST", "save_weights", api.save_weights), ("POST", "load_weights", api.load_weights),
        ("POST", "save_weights_for_sampler", api.save_for_sampler),
        ("POST", "create_sampling_session", api.create_sampling_session),
        ("GET", "samplers/{sampler_id}", api.get_sampler), ("POST", "asample", api.asample),
        ("POST", "retrieve_future", api.retrieve), ("POST", "cancel_future", api.cancel),
        ("POST", "telemetry", api.telemetry), ("*", "{tail:.*}", api.unsupported),
    ]  # fmt: skip
    app = web.Application(client_max_size=256 * 2**20)
    app.router.add_get("/api/v1/healthz", _healthz)  # open: says only that the server is up
    for method, path, handler in routes:
        app.router.add_route(method, f"/api/v1/{path}", _guarded(api, handler))
    app["tinker"] = api
    return app


async def _healthz(request: web.Request) -> web.Response:
    return _json(types.HealthResponse(status="ok"))


def _guarded(api: TinkerApp, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler` behind the key check, its ClientErrors as JSON `{"error": …}` with their status."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request, api.owner(request))
        except ClientError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    return guarded
