"""The broker's HTTP side (`[http]`, aiohttp): Prometheus `/metrics`, `/health`, the
`/status` page and its `/status.json`, and the admin API (`/api/v1/...`, API keys)."""
