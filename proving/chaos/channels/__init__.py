"""Chaos per channel: webhooks and Web Push through workers SIGKILLed mid-call
(`idempotent-workers chaos --profile webhooks|webpush`, `-ci` for the suite's form)."""
