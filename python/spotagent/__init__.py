"""spotagent: the trainer side of spotagent's protocol v1.

    import spotagent
    agent = spotagent.connect()      # $SPOTAGENT_SOCKET; a no-op agent when unset
    start = agent.resume_step or 0   # agent.resume_dir, agent.resume_metadata
    for step in range(start, total):
        train_one_step()
        req = agent.poll(step + 1)   # non-blocking: None or a CheckpointRequest
        if req:
            save_to(req.dir)
            req.done(step + 1, metadata={"epoch": epoch})
        if agent.should_stop:
            break
    agent.close()
    sys.exit(agent.exit_code)       # 75 after an interruption: run me again
"""

from .client import (
    EXIT_INTERRUPTED,
    MAX_LINE,
    MAX_METADATA,
    PROTOCOL_VERSION,
    Agent,
    CheckpointRequest,
    Committed,
    UploadFailed,
    connect,
    parse_time,
)

__all__ = [
    "Agent",
    "CheckpointRequest",
    "Committed",
    "UploadFailed",
    "connect",
    "parse_time",
    "EXIT_INTERRUPTED",
    "MAX_LINE",
    "MAX_METADATA",
    "PROTOCOL_VERSION",
]
__version__ = "0.1.0"
