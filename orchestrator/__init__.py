"""orchestrator"""
