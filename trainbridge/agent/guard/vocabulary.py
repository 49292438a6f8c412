"""The calls, modules and names the guard's rules recognise.

Kept apart from the rules so that the lists (loss operators, seed and exit calls, layer
containers, harness-owned environment variables, library roots that may not be patched) can
be read and extended in one place.
"""

# Loss operators, and the fused operators accepted as doing the same loss's job.
LOSS_CALLS = {"cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
              "l1_loss", "smooth_l1_loss", "kl_div", "huber_loss", "npu_cross_entropy_loss",
              "CrossEntropyLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss", "BCELoss", "L1Loss", "SmoothL1Loss"}
LOSS_EQUIVALENT = {"npu_cross_entropy_loss": "cross_entropy", "CrossEntropyLoss": "cross_entropy",
                   "NLLLoss": "nll_loss", "MSELoss": "mse_loss"}
LOSS_DEFAULTS = {"reduction": "'mean'", "ignore_index": "-100", "label_smoothing": "0.0", "weight": "None"}
SEED_CALLS = {"manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_seed",
              "use_deterministic_algorithms", "initial_seed", "fork_rng"}
EXIT_CALLS = {"_exit", "exit", "quit", "abort", "kill", "killpg"}
CONCURRENCY_CALLS = {"Thread", "Process", "Pool", "ThreadPoolExecutor", "ProcessPoolExecutor", "start_new_thread",
                     "fork", "spawn", "Popen", "run", "Timer", "start_processes"}
CONCURRENCY_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess", "signal",
                       "torch.multiprocessing", "asyncio"}
STREAM_CALLS = {"Stream", "stream", "ExternalStream", "set_stream"}
GRAD_OFF_CALLS = {"no_grad", "inference_mode", "set_grad_enabled", "requires_grad_"}
LAYER_CONTAINERS = {"blocks", "layers", "h", "layer", "encoder_layers", "decoder_layers", "transformer", "resblocks"}
LAYER_CONSTRUCTORS = {"ModuleList", "Sequential", "ModuleDict"}
FORWARD_NAMES = {"forward", "__call__", "_forward", "forward_features"}
HARNESS_ENV = {"PYTHONHASHSEED", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
               "ASCEND_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
# Attribute assignments rooted at a library that are settings, not patches (L0 knobs).
KNOB_PREFIXES = ("torch.backends.", "torch.npu.matmul.", "torch.npu.conv.", "torch_npu.npu.config.",
                 "torch.npu.config.", "torch._inductor.config.", "torch._dynamo.config.", "torch.set_float32_matmul")
PATCH_ROOTS = {"torch", "time", "os", "sys", "builtins", "trainbridge", "random", "numpy", "np", "math", "gc",
               "torch_npu", "F", "nn", "dist", "functools", "datetime", "timeit"}
# Calls that write code, load modules by name or reach into the interpreter, by dotted name.
REFLECTION_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module", "import_module",
                    "importlib.reload", "reload", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                    "sys._getframe", "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
                    "ctypes.CDLL", "ctypes.PyDLL", "ctypes.cdll.LoadLibrary", "os.system", "os.popen",
                    "os.execv", "os.execve", "os.execl", "os.execvp", "os.fork", "os.spawnv", "socket.socket",
                    "socket.create_connection", "builtins.exec", "builtins.eval", "globals"}
REFLECTION_ATTRIBUTES = {"sys.modules", "sys.meta_path", "sys.path_hooks", "sys.settrace", "sys.setprofile",
                         "sys.addaudithook", "builtins.__dict__", "__builtins__", "f_back", "f_globals", "f_locals",
                         "gi_frame", "tb_frame", "__globals__", "__code__", "__closure__"}
REFLECTION_MODULES = {"ctypes", "importlib", "inspect", "socket", "builtins", "runpy", "code", "codeop"}
