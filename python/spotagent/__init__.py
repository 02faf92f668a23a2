"""spotagent: the trainer side of spotagent's protocol v2.

    import spotagent
    agent = spotagent.connect()      # $SPOTAGENT_SOCKET; a no-op agent when unset
    build_model()                    # the agent restores meanwhile
    start = agent.resume_step or 0   # waits for the restore; agent.resume_dir, agent.resume_metadata
    for step in range(start, total):
        train_one_step()
        req = agent.poll(step + 1)   # non-blocking: None or a CheckpointRequest
        if req:
            # Non-blocking: tensors are copied to CPU memory here; files are
            # written, fsynced and uploaded in the background meanwhile.
            spotagent.torch.save(req, model.state_dict(), "model.pt")
            req.done(step + 1, metadata={"epoch": epoch})
        if agent.should_stop:
            break
    agent.close()                    # waits for a background save still writing
    sys.exit(agent.exit_code)       # 75 after an interruption: run me again; 76 fenced

In a torch.distributed job the same loop works unchanged, as long as every rank
calls poll once per step: the ranks agree on each request (and on stopping)
inside poll, so every rank saves the same step (see spotagent.dist).
"""

from .client import (
    EXIT_FENCED,
    EXIT_INTERRUPTED,
    MAX_LINE,
    MAX_METADATA,
    PROTOCOL_VERSION,
    Agent,
    AgentRefused,
    CheckpointRequest,
    Committed,
    RestoreFailed,
    UploadFailed,
    connect,
    parse_time,
)

from . import torch  # noqa: E402  (imports torch only when used)

__all__ = [
    "Agent",
    "AgentRefused",
    "CheckpointRequest",
    "Committed",
    "RestoreFailed",
    "UploadFailed",
    "connect",
    "parse_time",
    "EXIT_FENCED",
    "EXIT_INTERRUPTED",
    "MAX_LINE",
    "MAX_METADATA",
    "PROTOCOL_VERSION",
]
__version__ = "0.1.0"
