"""sim/memory"""
