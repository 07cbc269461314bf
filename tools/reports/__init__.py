"""tools/reports"""
