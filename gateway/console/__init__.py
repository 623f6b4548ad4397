"""The operator console: sign-in, projects, keys, usage, receipts, payments, playground."""
