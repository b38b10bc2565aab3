"""Tenancy: scopes, what a scope's runs may reach and use (capabilities, egress, budgets,
usage), its environment and where its secrets' values may go."""
