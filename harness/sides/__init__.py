"""sides"""
