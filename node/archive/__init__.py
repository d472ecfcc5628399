"""The node's archive client: ARCA embedded in-process or remote over RESP, behind a breaker."""
