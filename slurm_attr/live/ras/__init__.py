"""NCCL's RAS as a second opinion on a hang: the socket client and opinion, its status reports read."""
