"""provisioners/local"""
