"""The configuration schema: one frozen dataclass per component, every field documented.

Key names follow verl and ../shared/SPEC.md (`data.train_batch_size`, `rollout.n`,
`algorithm.adv_estimator`, `async_training.staleness_threshold`, ...). A key is declared here
once, whole: its type (a string choice is a `Literal` from `names.py`), its default, its range
(`knob(default, ">= 1")`, words from `fields.RULES`), a hint for its error message and the
pipelines that read it, and its docstring: the string literal right below it (read by
`keys.field_docs`). Validation (`validate.py`), `asyncrl config`'s docs (`keys.py`) and the
error messages read all of it from here; cross-field rules are in `validate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.config.fields import knob
from asyncrl.config.long_tail import (
    RewardSchedulerConfig,
    SandboxConfig,
    StreamTrainerConfig,
    TailBatchingConfig,
    TPPlannerConfig,
)
from asyncrl.config.names import (
    AdvEstimatorName,
    Backend,
    DecodeAttention,
    Device,
    Dtype,
    Engine,
    FusedDecode,
    Gsm8kMethod,
    KeepSlot,
    KLControl,
    KLKind,
    Logger,
    LossAggMode,
    LRSchedule,
    MixedPrecision,
    OffPolicyCorrection,
    OldLogProbs,
    PackedAttention,
    PackedPrefill,
    Pipeline,
    PolicyLossName,
    Task,
    ToolCallFormat,
    Truncation,
    VersionLagPolicy,
)


@dataclass(frozen=True)
class ModelConfig:
    path: str = "tiny"
    """Built in ('tiny', 'tiny-tools', 'tiny-countdown', 'tiny-longtail', 'smollm2-135m-instruct') or a HF model dir."""
    dtype: Dtype = "float32"
    """Compute dtype: the trainer computes in it over float32 masters (model.mixed_precision); engines hold it."""
    mixed_precision: MixedPrecision = "auto"
    """bf16 training: param_dtype = bf16 parameters over float32 masters (FSDP2's policy), autocast, or auto."""
    rebuild: bool = False
    """Rebuild the cached tiny model even if it exists."""
    lora_rank: int = knob(0, ">= 0")
    """LoRA adapter rank through peft (0 = full fine-tuning); the engine receives merged weights."""
    lora_alpha: int = knob(16, "> 0")
    """LoRA scaling alpha."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Modules that get LoRA adapters: all-linear or module names (q_proj, v_proj, ...)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    use_remove_padding: bool = True
    """Trainer runs each micro-batch's rows packed into one padding-free sequence (attention within each row)."""
    packed_attention: PackedAttention = "auto"
    """Packed rows' kernel: auto = varlen (CUDA, bf16/fp16), else jagged SDPA on CUDA, else grouped sdpa; or forced."""
    max_position_embeddings: int = knob(0, ">= 0")
    """Positions the model may use, overriding its config's (0 = its own; verl's override_config key)."""


@dataclass(frozen=True)
class DataConfig:
    task: Task = "arithmetic"
    """Built-in task used when train_files is empty."""
    task_options: tuple[str, ...] = ()
    """Options of the built-in task as name=value, e.g. [max_number=12]; for train and validation prompts alike."""
    task_size: int = knob(4096, ">= 1")
    """Number of generated training prompts for a built-in task."""
    val_size: int = knob(128, ">= 0")
    """Number of generated validation prompts for a built-in task."""
    train_files: tuple[str, ...] = ()
    """Parquet or JSONL files in the verl layout; empty means the built-in task."""
    val_files: tuple[str, ...] = ()
    """Held-out files for validation; empty: the task's test split (none with train_files; eval: the split)."""
    train_batch_size: int = knob(32, ">= 1")
    """Prompts per training step."""
    max_prompt_length: int = knob(64, ">= 1")
    """Longer prompts are dropped (counted), or cut as data.truncation says when filter_overlong_prompts is false."""
    filter_overlong_prompts: bool = True
    """Drop (and count) prompts longer than max_prompt_length; false: data.truncation decides."""
    truncation: Truncation = "error"
    """Unfiltered overlong prompt: error, or cut from the left (keep its end), right (keep its start) or middle."""
    max_response_length: int = knob(16, ">= 1")
    """Maximum generated tokens per response."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch."""
    chat_template: str = ""
    """A jinja chat template for tokenizers that have none."""
    chat_template_kwargs: tuple[str, ...] = ()
    """Extra chat-template variables as name=value, e.g. [enable_thinking=false] (verl's apply_chat_template_kwargs)."""


@dataclass(frozen=True)
class MultiTurnConfig:
    enable: bool = False
    """Rollouts are episodes: the model calls tools and reads their results over several turns (docs/agents.md)."""
    tool_config_path: str = ""
    """YAML of the episode's tools, verl's layout (OpenAI function schemas); "" = the built-in calculator and python."""
    format: ToolCallFormat = "hermes"
    """How tool calls are written in the model's output."""
    episode: str = ""
    """A custom episode function, "module:function" (docs/agents.md); "" = the built-in tool-calling episode."""
    max_assistant_turns: int = knob(5, ">= 1")
    """Model turns per episode at most."""
    max_user_turns: int = knob(5, ">= 0")
    """Tool/environment turns per episode at most (verl's max_user_turns)."""
    max_tool_calls: int = knob(8, ">= 0")
    """Tool calls per episode at most; a call past it becomes an error message to the model, counted."""
    max_parallel_calls: int = knob(0, ">= 0", hint="0 = no limit")
    """Tool calls run per model turn at most (verl's max_parallel_calls); the rest become error messages, counted."""
    max_tool_response_length: int = knob(256, ">= 1")
    """Characters of a tool's output kept (the rest cut and counted, as verl's)."""
    max_episode_tokens: int = knob(0, ">= 0", hint="0 = data.max_prompt_length + data.max_response_length")
    """Tokens of an episode at most, prompt and every turn included (0 = prompt + response lengths)."""
    tool_timeout_s: float = knob(10.0, "> 0")
    """Seconds a tool call may run; past it the call is a timeout message to the model, counted."""
    keep_slot: KeepSlot = "release"
    """During a tool call: release the episode's KV slot to the prefix cache, or keep it for the next turn."""


@dataclass(frozen=True)
class AgentConfig:
    entrypoint: str = ""
    """An agent written for the OpenAI API, "module:function" or "file.py:function"; turns agent episodes on."""
    timeout_s: float = knob(300.0, "> 0")
    """Seconds an agent episode may run; past it the agent is cancelled, counted, and its episode scores 0."""
    host: str = "127.0.0.1"
    """Where the endpoint listens for agents given a base_url: loopback (another address only for Ray across nodes)."""
    max_request_bytes: int = knob(1_048_576, ">= 1")
    """Bytes of one chat-completions request body at most (413 past it)."""
    max_concurrent_calls: int = knob(4, ">= 1")
    """Model calls of one episode in flight at once at most (429 past it)."""


@dataclass(frozen=True)
class RolloutConfig:
    n: int = knob(8, ">= 1")
    """Responses sampled per prompt (the group size)."""
    temperature: float = knob(1.0, "in (0, 10]", hint="at 0 the training log-probs are meaningless; for greedy "
                                                      "validation set rollout.val_temperature=0")
    """Sampling temperature during training rollouts."""
    top_p: float = knob(1.0, "in (0, 1]")
    """Nucleus sampling threshold."""
    top_k: int = knob(-1, "to -1 (off) or > 0")
    """Top-k sampling (-1 = off)."""
    length_from_prompt: bool = False
    """Benchmark workload: decode exactly the length a row's extra_info['length'] asks for (EOS ignored)."""
    ignore_eos: bool = False
    """Generate every training response to data.max_response_length (benchmarks, tests)."""
    kv_budget_tokens: int = knob(65536, ">= 1")
    """KV-cache capacity of one engine in tokens; exceeding it preempts sequences."""
    max_num_seqs: int = knob(256, ">= 1")
    """Maximum sequences decoded together by one engine."""
    gpu_memory_utilization: float = knob(0.5, "in (0, 1]")
    """CUDA: share of the GPU's memory the engine may use (weights + KV cache + activations), as vLLM's."""
    cuda_graphs: bool = True
    """CUDA: decode replayed from CUDA graphs over a static KV cache, one per batch bucket (and length: matmul)."""
    decode_attention: DecodeAttention = "auto"
    """Decode attention: triton = split-KV kernel over each row's own length (auto: on CUDA); matmul = padded."""
    fused_decode: FusedDecode = "auto"
    """Decode step with merged projections and fused Triton norm/rotary/SiLU kernels (auto: on CUDA; off on CPU)."""
    packed_prefill: PackedPrefill = "auto"
    """Prefill the admitted prompts packed, unpadded (auto: varlen attention on CUDA bf16/fp16); off: padded."""
    admit_min_free_slots: int = knob(0, ">= 0", hint="0 picks it from the device")
    """Admit when min(this, waiting requests) slots are free or none runs (0: 1 on CPU, max_num_seqs/8 on CUDA)."""
    engine: Engine = "torch"
    """Rollout engine (asyncrl.rollout.registry): torch = continuous batching in plain torch."""
    num_engines: int = knob(1, ">= 1")
    """Rollout workers behind the router, one engine each (they share rollout.num_cpus)."""
    max_restarts: int = knob(0, ">= 0")
    """Ray: restarts of a dead rollout worker (the others take its groups; it rejoins at the next sync); 0 stops."""
    tensor_model_parallel_size: int = knob(1, ">= 1")
    """Devices per rollout engine (modelled by `asyncrl sim`; the CPU torch engine runs with 1)."""
    val_n: int = knob(4, ">= 1")
    """Responses per validation prompt (mean@k / pass@k over them)."""
    val_temperature: float = knob(1.0, "in [0, 10]")
    """Validation temperature (0 = greedy); at the training temperature mean@k is the policy's expected reward."""
    val_top_p: float = knob(1.0, "in (0, 1]")
    """Validation nucleus sampling (verl's val_kwargs.top_p)."""
    val_top_k: int = knob(-1, "to -1 (off) or > 0")
    """Validation top-k sampling, -1 = off (verl's val_kwargs.top_k)."""
    nnodes: int = knob(1, ">= 1")
    """Nodes given to rollout in decoupled pipelines."""
    n_gpus_per_node: int = knob(0, ">= 0")
    """GPUs per rollout node (0 on CPU machines)."""
    num_cpus: int = knob(1, ">= 1")
    """CPU cores given to rollout in decoupled pipelines (torch threads of the compute thread its engines share)."""
    total_rollout_steps: int = knob(0, ">= 0", read_by=("fully_async",))
    """Fully async: total prompts to generate (0 = train_batch_size x total_training_steps)."""
    test_freq: int = knob(0, ">= 0", read_by=("fully_async",))
    """Fully async: validate every N weight versions (0 = off)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn, tool-calling episodes (docs/agents.md)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Bring your own agent: one written for the OpenAI API, trained through an episode endpoint (docs/agents.md)."""


@dataclass(frozen=True)
class ActorConfig:
    lr: float = knob(2e-4, "> 0")
    """AdamW learning rate."""
    warmup_steps: int = knob(5, "to -1 (off) or >= 0")
    """Linear learning-rate warm-up in optimizer steps (-1: use warmup_ratio)."""
    warmup_ratio: float = knob(0.0, "in [0, 1]")
    """Warm-up as a fraction of all optimizer steps, when warmup_steps is -1 (verl lr_warmup_steps_ratio)."""
    lr_scheduler: LRSchedule = "constant"
    """Learning rate after warm-up (cosine decays to min_lr_ratio x lr over the run)."""
    min_lr_ratio: float = knob(0.0, "in [0, 1]")
    """Cosine schedule: the final learning rate as a fraction of lr."""
    weight_decay: float = knob(0.0, ">= 0")
    """AdamW weight decay."""
    betas: tuple[float, float] = knob((0.9, 0.999), "in [0, 1)")
    """AdamW betas."""
    grad_clip: float = knob(1.0, "> 0")
    """Gradient-norm clipping threshold."""
    ppo_epochs: int = knob(1, ">= 1")
    """Passes over each batch."""
    ppo_mini_batch_size: int = knob(16, ">= 1")
    """Prompts per optimizer step (global)."""
    ppo_micro_batch_tokens: int = knob(0, ">= 0", hint="0 derives it from the device")
    """Token budget of one forward/backward micro-batch (0 = derived: 8192 on CPU, on CUDA from memory and model)."""
    log_prob_micro_batch_tokens: int = knob(0, ">= 0", hint="0 is twice the training budget")
    """Token budget of one forward-only micro-batch: old/ref log-probs, values (0 = twice ppo_micro_batch_tokens)."""
    policy_loss: PolicyLossName = "vanilla"
    """Policy loss (vanilla = PPO clip)."""
    clip_ratio_low: float = knob(0.2, ">= 0")
    """Lower PPO clip epsilon."""
    clip_ratio_high: float = knob(0.2, ">= 0")
    """Upper PPO clip epsilon (DAPO clip-higher uses 0.28)."""
    clip_ratio_c: float = knob(3.0, "> 1", hint="it is the dual-clip bound of negative advantages")
    """Dual-clip bound for negative advantages."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How token losses are averaged into the batch loss."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) term to the loss (GRPO style)."""
    kl_loss_coef: float = knob(0.001, ">= 0")
    """Coefficient of the KL loss."""
    kl_loss_type: KLKind = "low_var_kl"
    """KL estimator for the loss."""
    old_log_probs: OldLogProbs = knob("auto", read_by=("colocated",))
    """Colocated: PPO's old log-probs: recompute (a pass before the update), rollout (the engine's) or auto."""
    off_policy_correction: OffPolicyCorrection = "none"
    """Decoupled PPO importance weights behaviour->proximal, per token or per sequence."""
    is_cap: float = knob(2.0, "> 0")
    """Truncation cap of those importance weights."""
    use_torch_compile: bool | None = None
    """torch.compile each decoder layer (actor and reference); null = off (CPU: measured; CUDA: until measured)."""


@dataclass(frozen=True)
class CriticConfig:
    lr: float = knob(1e-4, "> 0")
    """Critic learning rate."""
    warmup_steps: int = knob(0, ">= 0")
    """Critic learning-rate warm-up."""
    grad_clip: float = knob(1.0, "> 0")
    """Critic gradient-norm clipping."""
    cliprange_value: float = knob(0.5, "> 0")
    """Value clipping range."""
    ppo_epochs: int = knob(1, ">= 1")
    """Critic passes per batch."""


@dataclass(frozen=True)
class KLControlConfig:
    type: KLControl = "fixed"
    """KL-in-reward coefficient: fixed, or adapted towards target_kl."""
    kl_coef: float = knob(0.001, ">= 0")
    """Initial (or fixed) KL-in-reward coefficient."""
    target_kl: float = knob(0.1, "> 0")
    """Adaptive controller target."""
    horizon: int = knob(10000, ">= 1")
    """Adaptive controller horizon."""


@dataclass(frozen=True)
class FilterGroupsConfig:
    enable: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all agree and refill the batch."""
    max_num_gen_batches: int = knob(4, ">= 0")
    """Generation rounds allowed per step to fill the batch (0 = unlimited)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: AdvEstimatorName = "grpo"
    """Advantage estimator."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group std (False = Dr.GRPO)."""
    gamma: float = knob(1.0, "in [0, 1]")
    """Discount factor."""
    lam: float = knob(1.0, "in [0, 1]")
    """GAE lambda."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the token-level reward."""
    kl_penalty: KLKind = "kl"
    """KL estimator in the reward."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""


@dataclass(frozen=True)
class RewardConfig:
    custom_function: str = ""
    """A user scorer 'module:function' or 'file.py:function' (verl compute_score signature)."""
    timeout_s: float = knob(10.0, "> 0")
    """A reward call past this many seconds is killed and scores 0 with status timeout."""
    num_workers: int = knob(2, ">= 1")
    """Reward worker processes (each call runs in one; a call past timeout_s kills its process)."""
    max_failure_ratio: float = knob(0.5, "in (0, 1]")
    """Stop the run when more than this fraction of one step's rewards fail (error, timeout, invalid)."""
    functions: tuple[str, ...] = ()
    """TRL reward functions f(prompts, completions, **columns) as 'module:fn'; their weighted sum is the reward."""
    function_weights: tuple[float, ...] = ()
    """One weight per reward.functions entry (TRL's reward_weights); empty = 1 each."""
    overlong_buffer: int = knob(0, ">= 0")
    """DAPO soft overlong punishment: the last N tokens before overlong_max_len cost up to the factor (0 = off)."""
    overlong_penalty_factor: float = knob(1.0, ">= 0")
    """The punishment at overlong_max_len tokens (DAPO's penalty_factor); it grows linearly over the buffer."""
    overlong_max_len: int = knob(0, ">= 0")
    """The length the punishment reaches its full factor at (DAPO's max_resp_len; 0 = data.max_response_length)."""
    gsm8k_method: Gsm8kMethod = "strict"
    """Built-in GSM8K scorer: strict = the last '#### n' (verl's default), flexible = the last number, auto = either."""
    model_path: str = ""
    """A local reward model (AutoModelForSequenceClassification, one label) scoring each response ('' = none)."""
    model_weight: float = 1.0
    """The reward model's score's weight in the reward (its unweighted score: details 'reward_model')."""
    rule_weight: float = 1.0
    """With model_path: the rule reward's weight (details 'rule'); 0 = the reward model alone, no rule run (verl's)."""
    model_batch_size: int = knob(8, ">= 1")
    """Responses per reward-model forward (verl's reward_model.micro_batch_size_per_gpu)."""
    model_max_length: int = knob(0, ">= 0")
    """Tokens the reward model reads per response, the last ones kept (0 = its max_position_embeddings)."""


@dataclass(frozen=True)
class TrainerConfig:
    total_training_steps: int = knob(60, ">= 1")
    """Optimizer steps (policy updates) in the run."""
    test_freq: int = knob(10, ">= 0")
    """Validate every N steps (0 = only at start and end)."""
    save_freq: int = knob(0, ">= 0")
    """Checkpoint every N steps (0 = only at the end and on a stop signal)."""
    max_ckpt_to_keep: int = knob(3, ">= 0")
    """Complete checkpoints kept; older ones are deleted once a newer one is complete (0 = keep all)."""
    output_dir: str = ""
    """Where metrics, checkpoints, traces and config go ('' = outputs/<experiment_name>-<time>, new per run)."""
    resume_mode: str = "auto"
    """auto (continue output_dir's newest complete checkpoint, if any) | disable | a run or checkpoint directory."""
    allow_config_change: bool = False
    """Let a resumed run change the config it was started with (the differing keys are printed)."""
    stop_timeout_s: float = knob(60.0, "> 0")
    """On SIGINT/SIGTERM: seconds allowed to stop generation, finish the update and checkpoint."""
    logger: tuple[Logger, ...] = ("console", "jsonl", "tensorboard")
    """Metric sinks; metrics.jsonl is written whatever this lists (it is the run's record)."""
    project_name: str = "asyncrl"
    """W&B project."""
    experiment_name: str = "run"
    """W&B run name."""
    val_before_train: bool = True
    """Validate once before the first step."""
    log_generations: int = knob(16, ">= 0")
    """Trained responses per step written to generations.jsonl, whole groups in a seeded sample (0 = off)."""
    log_val_generations: int = knob(-1, "to -1 (all) or >= 0")
    """Validation responses per validation written to generations.jsonl (-1 = all, 0 = off)."""
    rollout_data_dir: str = ""
    """Directory of the training generations.jsonl ('' = output_dir)."""
    validation_data_dir: str = ""
    """Directory of the validation generations.jsonl ('' = output_dir; asyncrl eval: beside its --out)."""
    nnodes: int = knob(1, ">= 1")
    """Nodes given to training in decoupled pipelines."""
    n_gpus_per_node: int = knob(0, ">= 0")
    """GPUs per training node (0 on CPU machines)."""
    num_cpus: int = knob(1, ">= 1")
    """CPU cores given to training in decoupled pipelines (torch threads of its compute thread)."""
    device: Device = "cpu"
    """Where the trainer (and, in colocated runs, the engines) compute."""
    ranks: int = knob(1, ">= 1")
    """backend=processes: trainer processes training one model with FSDP2 (rank r on GPU r with cuda; gloo on CPU)."""


@dataclass(frozen=True)
class AsyncTrainingConfig:
    require_batches: int = knob(1, ">= 1", read_by=("fully_async",))
    """Mini-batches of samples the trainer collects before one local update."""
    trigger_parameter_sync_step: int = knob(1, ">= 1", read_by=("fully_async",))
    """Local updates between weight syncs."""
    staleness_threshold: float = knob(0.0, ">= 0", read_by=("fully_async",))
    """Extra fraction of prompts the rollouter may start per version (0 = synchronous streaming)."""
    partial_rollout: bool = knob(False, read_by=("fully_async",))
    """Interrupt in-flight generations at a sync and continue them under the new weights."""
    use_rollout_log_probs: bool = knob(True, read_by=("one_step_off", "fully_async"))
    """Use the engine's behaviour log-probs as old log-probs in the PPO ratio."""
    max_version_lag: int = knob(-1, "to -1 (off) or >= 0", read_by=("fully_async",))
    """Strict per-sample cap on (trainer version - sample start version); -1 = off."""
    version_lag_policy: VersionLagPolicy = knob("pace", read_by=("fully_async",))
    """pace: the trainer waits for a group before a sync would put it past max_version_lag; drop: regenerate it."""
    max_concurrent_samples_per_server: int = knob(16, ">= 0", read_by=("fully_async",))
    """Prompts generating at once per rollout engine (verl's max_concurrent_samples = 16 x servers); 0 = no cap."""


@dataclass(frozen=True)
class SimConfig:
    profile: str = "h20-qwen2.5-7b"
    """Hardware/model profile of `asyncrl sim`: built-in (h20-qwen2.5-7b, cpu-tiny) or a YAML from `sim --fit`."""
    length_median: float = knob(1000.0, "> 0")
    """Median response length in tokens (lognormal; ignored with rollout.length_from_prompt)."""
    length_sigma: float = knob(0.9, ">= 0")
    """Lognormal shape of response lengths: 0.9 puts the longest of 8K responses ~25x above the median."""
    length_growth: float = 0.0025
    """Relative growth of the median length per policy version (0.0025 doubles it in 400 versions, as DAPO runs)."""
    length_prompt_share: float = knob(0.0, "in [0, 1]")
    """Share of the log-length variance a prompt explains (its difficulty): 0 = responses independent of the prompt."""
    prompt_length: int = knob(150, ">= 1")
    """Prompt tokens per row."""
    accuracy: float = knob(0.5, "in [0, 1]")
    """Probability a response scores 1 (drives dynamic sampling; the simulator models no learning)."""
    trace_max_events: int = knob(100000, ">= 0")
    """Events in the simulated trace.json: all phase spans, per-sample spans sampled over the run to fit."""
    gpu_memory_utilization: float = 0.0
    """Share of each modelled GPU for weights + KV cache (vLLM's knob); 0 = the profile's value."""
    fsdp_size: int = -1
    """FSDP shard group of the modelled trainer (verl's actor fsdp_config.fsdp_size): -1 = every trainer GPU."""
    turns_mean: float = knob(0.0, ">= 0", hint="0 = every episode takes rollout.multi_turn.max_assistant_turns")
    """Mean assistant turns of a modelled episode (1 + Poisson, capped at max_assistant_turns); 0 = always the cap."""
    tool_latency_median_s: float = knob(1.0, "> 0")
    """Median seconds of a modelled tool call between two turns (lognormal; capped at multi_turn.tool_timeout_s)."""
    tool_latency_sigma: float = knob(1.0, ">= 0")
    """Lognormal shape of tool latencies: 1.0 puts one call in 20 above 5x the median."""
    tool_output_tokens: int = knob(64, ">= 0")
    """Tokens a tool result appends to a modelled episode's context (the tool message with its delimiters)."""
    prefix_caching: bool = True
    """The modelled engine keeps a conversation's KV between turns (vLLM's prefix caching): turns prefill new tokens."""


@dataclass(frozen=True)
class Config:
    pipeline: Pipeline = "colocated"
    """How generation and training overlap (README's pictures)."""
    backend: Backend = "local"
    """Where workers run: local (this process), processes (one per worker here: decoupled on one GPU), ray."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    num_threads: int = knob(0, ">= 0")
    """torch threads of a colocated run's compute thread, which engines and trainer share (0 = all cores)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and lengths."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (adv_estimator=gae only)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and KL."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, validation, checkpoints, logging."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Fully asynchronous pipeline."""
    tail_batching: TailBatchingConfig = field(default_factory=TailBatchingConfig)
    """Long-tail remedy: speculative short rounds and long rounds."""
    reward_scheduler: RewardSchedulerConfig = field(default_factory=RewardSchedulerConfig)
    """Long-tail remedy: rewards as responses finish, adaptive code timeouts."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where code rewards run model-written programs."""
    stream_trainer: StreamTrainerConfig = field(default_factory=StreamTrainerConfig)
    """Long-tail remedy: gradients of finished groups while the rest generate."""
    tp_planner: TPPlannerConfig = field(default_factory=TPPlannerConfig)
    """Long-tail remedy: rollout tensor-parallel size from preemptions."""
    sim: SimConfig = field(default_factory=SimConfig)
    """The cluster simulator (`asyncrl sim`): profile and workload."""
