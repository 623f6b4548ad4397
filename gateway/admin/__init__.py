"""The admin service: every change to projects, keys, users, grants, payments, credits,
purchases and sandbox configurations, with typed arguments, for the CLI and the console.

One function per change (project_admin, key_admin, user_admin, money_admin,
sandbox_admin), each taking an `AdminContext` (admin_context): the one place a change is
made, so the one place it will be recorded. Changes that every instance must drop from its
caches (updates, archives, revocations) return once the instances confirmed them
(gateway/cluster/admin_confirm.py). admin_views holds the record views the CLI's JSON and the
console's JSON share. Argument parsing stays with the CLI, JSON fields with the console.
"""
