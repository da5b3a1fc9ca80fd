"""The old home of run directories and every other path a command is given, kept so that existing imports work.
Each concern now has its own module, and depthlab's own code imports from there:

    depthlab.paths       file names, what a path is (`what_is`, `Kind`), the model a path names (`model_path`)
    depthlab.owned       locks, the one ownership rule (`claim`), outputs written whole (`writing`)
    depthlab.loading     a depthlab checkpoint as a model (`load_checkpoint`), a LoRA run's adapters merged
    depthlab.hf.load     a model from any model path, an HF directory included (`load_model`, `Loaded`)
    depthlab.checkpoint  the checkpoint format
"""

from depthlab.checkpoint import (  # noqa: F401
    CHECKPOINTS,
    CONFIG,
    META,
    SHARDS,
    TOKENIZER,
    TRAINER,
    WEIGHTS,
    CorruptCheckpoint,
    is_sharded,
    is_valid,
    list_checkpoints,
    load_verified,
    load_weights,
    newest_valid_checkpoint,
    previous_checkpoint,
    save_weights,
    usual_mode,
    verify_checkpoint,
    warn,
)
from depthlab.hf.load import Loaded, hf_context, load_hf_tokenizer, load_model, quiet_transformers  # noqa: F401
from depthlab.loading import DTYPES, load_checkpoint, torch_dtype  # noqa: F401
from depthlab.owned import (  # noqa: F401
    claim,
    is_analysis,
    is_comparison,
    is_depthlab_hf,
    lock_text,
    locked,
    refuse_own_input,
    writing,
    writing_files,
)
from depthlab.paths import (  # noqa: F401
    ANALYSIS_REPORT,
    ANALYSIS_RESULTS,
    ENV,
    EXPORT_INFO,
    LOCK_SUFFIX,
    METRICS,
    PREPARED_FORMAT,
    PREPARED_INDEX,
    PREPARED_PLAN,
    PREPARED_WORK,
    VAL_TOKENS,
    WANT_MODEL,
    Kind,
    find_checkpoint,
    model_path,
    not_a_model,
    read_json,
    run_of,
    runs_in,
    what_is,
)

_read_json = read_json
